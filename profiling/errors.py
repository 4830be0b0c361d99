"""The one error type the tools raise for bad input: its message is the whole one-line report."""


class UserError(Exception):
    """Bad input the user can fix. The message names the problem and the fix; the CLI exits 2."""
