"""The researcher's instruments: numbers that say how well a pack reads a text.

    windows.py     the text's tokens cut into llama-perplexity's windows (BOS, scored half)
    stats.py       llama.cpp's statistics: mean ± uncertainty, covariance, percentiles
    logprobs.py    per-token rows: negative log-likelihood, llama.cpp's uint16 log-probs, KLD
    kldfile.py     the KL-divergence base file (llama.cpp's layout + strata's identity trailer)
    perplexity.py  the instrument: windows -> logits (a function) -> PPL / KLD results
"""
