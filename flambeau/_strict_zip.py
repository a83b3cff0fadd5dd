"""One strict zip reader for the archives flambeau writes and reads back as untrusted input.

`flambeau.export.load` (serde.py) and `aoti_load_package` (_inductor/aoti_package.py) both read a zip
whose entry names are fixed in advance. `read_strict_zip` returns {entry name: bytes} and refuses,
with the caller's error type and name in the message: a file that is not a zip (truncated, garbage),
any entry not in the expected set (path names, '..', absolute paths, unknown files), duplicates,
missing entries, an entry that claims more than the caller's size bound, a corrupt entry (the zip
CRC is checked on read) and an `archive_format` entry other than the caller's. Nothing is extracted:
the caller decides what to write where.
"""
from __future__ import annotations

import zipfile

_ZIP_ERRORS = (zipfile.BadZipFile, OSError, EOFError, ValueError)
_READ_ERRORS = _ZIP_ERRORS + (NotImplementedError,)
ARCHIVE_FORMAT_ENTRY = "archive_format"


def read_strict_zip(f, entries: tuple, *, archive_format: bytes, max_entry_bytes: int,
                    error: type, caller: str, what: str) -> dict:
    """{name: bytes} of the zip `f` (path or binary file object) holding exactly `entries`, one of
    them `archive_format` with the content `archive_format`. Failures raise `error` with messages
    that start with `caller` and call the file `what` (e.g. "exported-program archive")."""
    try:
        z = zipfile.ZipFile(f)
    except _ZIP_ERRORS as e:
        raise error(f"{caller}: not an {what} ({e}); the file is truncated or corrupt") from None
    with z:
        infos = z.infolist()
        names = [i.filename for i in infos]
        for n in names:
            if n not in entries:
                raise error(f"{caller}: unexpected entry {n!r} in the {what} (path names, '..' and unknown files "
                            f"are refused; expected {', '.join(entries)})")
        if len(set(names)) != len(names):
            raise error(f"{caller}: the {what} has duplicate entries")
        missing = [n for n in entries if n not in names]
        if missing:
            raise error(f"{caller}: the {what} lacks {', '.join(missing)}")
        out = {}
        for i in infos:
            if i.file_size > max_entry_bytes:
                raise error(f"{caller}: entry {i.filename} claims {i.file_size} bytes (at most {max_entry_bytes})")
            try:
                out[i.filename] = z.read(i)
            except _READ_ERRORS as e:
                raise error(f"{caller}: entry {i.filename} is corrupt ({e}); the file is truncated or altered") \
                    from None
    if out[ARCHIVE_FORMAT_ENTRY] != archive_format:
        raise error(f"{caller}: unknown archive format {out[ARCHIVE_FORMAT_ENTRY][:40]!r} (expected "
                    f"{archive_format!r})")
    return out
