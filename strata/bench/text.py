"""The text the perplexity experiments read (experiments/quant_quality.py, experiments/ppl_side.py):
the repository's perplexity text (tests/data/llama_perplexity/text.txt, argparse's module
docstring) followed by the docstrings of a fixed list of standard-library modules, repeated whole
until long enough. No network on the machines that run them, so the text comes from what is
installed; the same list on every machine gives the same text.
"""
from __future__ import annotations

import bisect
import collections
import csv
import dataclasses
import enum
import functools
import heapq
import inspect
import itertools
import json
import logging
import pathlib
import pickle
import re
import shutil
import socket
import string
import subprocess
import tempfile
import textwrap
import threading
import typing
import unittest
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]
TEXT = ROOT / "tests" / "data" / "llama_perplexity" / "text.txt"
MORE_TEXT = (json, collections, functools, itertools, pathlib, subprocess, logging, unittest,
             dataclasses, typing, textwrap, string, re, csv, shutil, tempfile, threading, socket,
             inspect, pickle, heapq, bisect, enum)     # their docstrings


def text(n_chars: int) -> tuple[str, int]:
    """The repository's perplexity text, then standard-library docstrings, repeated whole if
    still short: (text of at least n_chars characters, how many times the sources repeat)."""
    parts = [TEXT.read_text(encoding="utf-8")]
    for module in MORE_TEXT:
        doc = module.__doc__
        if doc:
            parts.append(doc)
    one = "\n\n".join(parts)
    reps = max(1, -(-n_chars // len(one)))
    return "\n\n".join([one] * reps), reps


def text_of_tokens(encode: Callable[[str], list[int]], n_tokens: int, *,
                   cut: bool = False) -> tuple[str, list[int], int]:
    """(text, encode(text), repeats): whole repeats of `text` enough for `encode` to give at least
    n_tokens ids (the characters a token takes measured on the way); cut=True trims it to a
    prefix ending a line that still gives n_tokens (a file for a tool that reads it all)."""
    chars = n_tokens
    while True:
        t, reps = text(chars)
        ids = encode(t)
        if len(ids) >= n_tokens:
            return (*_cut(encode, t, ids, n_tokens), reps) if cut else (t, ids, reps)
        # grow by the measured characters per token, with a margin, at least doubling once short
        chars = max(2 * chars, int(len(t) * n_tokens / max(1, len(ids)) * 1.05) + 1)


def _cut(encode, t: str, ids: list[int], n_tokens: int) -> tuple[str, list[int]]:
    """A prefix of t ending a line, by the measured characters per token plus 1%, grown by 2%
    until it gives n_tokens (the text repeats, so a token's characters hardly vary)."""
    frac = n_tokens / len(ids) * 1.01
    while frac < 1:
        end = t.find("\n", int(len(t) * frac))
        if end < 0:
            break
        got = encode(t[:end + 1])
        if len(got) >= n_tokens:
            return t[:end + 1], got
        frac *= 1.02
    return t, ids
