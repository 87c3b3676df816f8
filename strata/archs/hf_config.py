"""A record's reading of a Hugging Face config.json: a field it lacks or holds with the wrong
type ends the read in one line naming the file, never a traceback."""
from __future__ import annotations

import contextlib

from strata.errors import StrataError


@contextlib.contextmanager
def config_fields(where):
    """Inside: the config's fields read by a record's hf_shape; a KeyError (a field missing) or a
    TypeError / ValueError (a field of the wrong type) leaves as one StrataError about `where`."""
    try:
        yield
    except KeyError as e:
        raise StrataError(f"{where}: config.json lacks {e.args[0]}") from None
    except (TypeError, ValueError) as e:
        raise StrataError(f"{where}: config.json has a value of the wrong type ({e})") from None
