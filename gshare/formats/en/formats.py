"""English (``en``, ``en-us``...) formats of the console: ISO dates, 24-hour times, always with the zone, so a time
read off the console is never ambiguous (``2026-12-01 11:30 UTC``). Format characters: Django's ``date`` filter."""

DATE_FORMAT = "Y-m-d"
TIME_FORMAT = "H:i T"
DATETIME_FORMAT = "Y-m-d H:i T"
SHORT_DATE_FORMAT = "Y-m-d"
SHORT_DATETIME_FORMAT = "Y-m-d H:i T"
MONTH_DAY_FORMAT = "F j"
YEAR_MONTH_FORMAT = "F Y"
FIRST_DAY_OF_WEEK = 1  # Monday (ISO 8601)
