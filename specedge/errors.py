"""Errors meant for users: the CLI prints them as one line and exits non-zero."""


class SpecedgeError(Exception):
    """A problem with user input, a bundle or a source model, worded for the user."""


class BundleError(SpecedgeError):
    """A bundle is missing, corrupt or of an unknown format version."""


class ExportError(SpecedgeError):
    """An export could not be completed; nothing was written at the destination."""


class OptionError(SpecedgeError):
    """An invalid generation option (a usage error on the command line)."""
