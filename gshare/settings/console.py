"""The console's display settings: datetimes with their zone (``2026-12-01 11:30 UTC``), ISO dates."""

#: ``gshare/formats/<lang>/formats.py`` override Django's locale formats for the console's pages.
FORMAT_MODULE_PATH = ["gshare.formats"]
