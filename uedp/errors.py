"""The one error type users see: it carries a one-line message and maps to exit code 2."""


class UedpError(Exception):
    """Bad input or state the user can fix. The CLI prints ``error: <message>`` and exits 2."""
