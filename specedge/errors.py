"""Errors meant for users: the CLI prints them as one line and exits non-zero."""


class SpecedgeError(Exception):
    """A problem with user input, a bundle or a source model, worded for the user."""


class BundleError(SpecedgeError):
    """A bundle is missing, corrupt or of an unknown format version."""


class ExportError(SpecedgeError):
    """An export could not be completed; nothing was written at the destination."""


class OptionError(SpecedgeError):
    """An invalid generation option (a usage error on the command line)."""


class NoDraftModel(OptionError):
    """Drafting asked of a bundle that has no draft model. Each front end words the way out in its own terms
    (worded): the Python API's options here, the CLI's flags, the server's request fields."""

    def __init__(self, drafter: str):
        self.drafter = drafter
        super().__init__(self.worded("use_draft=False", "drafter='ngram'"))

    def worded(self, target_alone: str, prompt_lookup: str) -> str:
        return (f"this bundle has no draft model (drafter '{self.drafter}' needs one); run the target alone "
                f"({target_alone}), or draft by prompt lookup ({prompt_lookup})")


class ExportOptionError(ExportError, OptionError):
    """An export option out of its range or in a combination that cannot be exported: an ExportError for the Python
    API, a usage error (exit 2) on the command line."""
