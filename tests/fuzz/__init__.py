"""The standing fuzz suite (issue 22): hostile manifests, indexes, cache state and
Example payloads against every reader, with only two outcomes allowed — the right
data, or a ``RecordkitError``. See ``test_fuzz.py``."""
