"""The one error type the CLI turns into a clear message and exit status 2."""


class LaunchError(Exception):
    """Bad input or an infrastructure failure; the message is meant for the user."""
