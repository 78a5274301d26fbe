"""How every command meets bad input and how it ends: `train.py` and ``python -m
bertjax.predict``, ``.embed``, ``.compile``, ``.glue``, ``.diffusion`` and ``.data.prepare``.

Exit statuses are a contract with whatever runs the command (a shell, Kubernetes, SLURM,
torchrun, systemd), the same for every command and every process of a run:

  0    `FINISHED`     done
  1    `BUG`          an error bertjax did not expect (Python's own status for an uncaught
                      exception): read the traceback, report it
  2    `BAD_INPUT`    bad input (a flag, a file, a config key): one line says what and where;
                      rerunning the same command fails the same way, so do not restart
  75   `RETRY`        not done, restart the same command: storage stayed unreachable past
                      its retry budget, or another process of the run was lost (EX_TEMPFAIL of
                      sysexits.h); the rerun resumes from the last complete checkpoint
  128+N `stopped_by(N)` stopped by signal N after saving (143 for SIGTERM, a preemption;
                      130 for Ctrl-C); not done, restart: the rerun resumes where it stopped.
                      A process of a multi-process run stopped because another was signalled
                      exits 143 too.

A bad flag, a path that names nothing, a file that is not what it should be (not UTF-8, no
such column, not a BEIR directory, ...) stops the command with one line on stderr,
``error: WHAT``, naming the flag, or the file and line, and exit status 2. The traceback is
printed only with ``--verbosity=1`` (``-v 1``). Bad input is what bertjax raises for it:
ValueError and OSError (FileNotFoundError, `bertjax.paths.MissingPathError`), whose messages
name what and where; anything else keeps its traceback.

Faces built on absl flags parse their own `flags.FlagValues` with `run` (so a test can call
``main(argv)`` more than once in one process); train.py and bertjax.compile keep absl's global
flags and `app.run` with this module's `parse_flags` and `input_errors`; an argparse face uses
`ArgumentParser`.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import NoReturn

FINISHED = 0
BUG = 1  # an uncaught exception (Python's status)
BAD_INPUT = 2  # the exit status of every command stopped by bad input
RETRY = 75  # EX_TEMPFAIL: storage unreachable past its budget, or a lost process; restart
STOPPED = 128 + 15  # stopped by SIGTERM after saving (or because another process was signalled)
INPUT_ERRORS = (ValueError, OSError)
# How the runtime's status codes open an error's text: a collective or a device call that failed
# (jaxlib raises a Gloo collective's failure as a ValueError, most others as JaxRuntimeError).
RUNTIME_STATUSES = (
    "UNKNOWN:", "INTERNAL:", "UNAVAILABLE:", "ABORTED:", "CANCELLED:", "DEADLINE_EXCEEDED:",
    "FAILED_PRECONDITION:", "RESOURCE_EXHAUSTED:",
)  # fmt: skip


def runtime_failure(error: BaseException) -> bool:
    """Whether ``error`` (or one it was raised from) is the runtime's: a failed collective or
    device call, never bad input; under --multihost possibly a sign of a lost process."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if type(error).__name__ in ("JaxRuntimeError", "XlaRuntimeError"):
            return True
        if isinstance(error, (ValueError, RuntimeError)):
            if str(error).startswith(RUNTIME_STATUSES):
                return True
        error = error.__cause__ or error.__context__
    return False


def stopped_by(signum: int | None) -> int:
    """The exit status of a run stopped by signal ``signum`` after saving (None: another
    process of the run was signalled): 128 + the signal, as a shell reports a signal's kill."""
    return STOPPED if signum is None else 128 + int(signum)


VERBOSE = 1  # the --verbosity from which a stopped command prints its traceback


class BadInput(SystemExit):
    """A command stopped by bad input (exit status 2); ``str()`` is the message."""

    def __init__(self, message: str):
        super().__init__(BAD_INPUT)
        self.message = message

    def __str__(self) -> str:
        return self.message


def fail(message: str) -> NoReturn:
    """Stops the command: ``error: MESSAGE`` (one line) on stderr, exit status 2."""
    line = " ".join(str(message).split())
    print(f"error: {line}", file=sys.stderr)
    raise BadInput(line)


@contextlib.contextmanager
def input_errors(verbose: bool) -> Iterator[None]:
    """Inside: ValueError and OSError stop the command with `fail` (their traceback instead
    when ``verbose``); `bertjax.retry.Retryable` (StorageUnavailable) with `unavailable`
    (status RETRY).
    The line ends saying how to get the traceback: the same exception types can come from a
    bug rather than from bad input, and the traceback is what a report needs."""
    from bertjax.retry import Retryable

    try:
        yield
    except Retryable as error:  # not bad input: restart (RETRY)
        if verbose:
            raise
        unavailable(error)
    except INPUT_ERRORS as error:
        if verbose or runtime_failure(error):  # the runtime's failure: its traceback
            raise
        fail(f"{str(error) or type(error).__name__} (--verbosity=1 prints the traceback)")


def unavailable(error: BaseException) -> NoReturn:
    """Stops the command: ``error: MESSAGE`` (one line) on stderr, exit status `RETRY`."""
    line = " ".join(str(error).split())
    print(f"error: {line}", file=sys.stderr)
    raise SystemExit(RETRY)


def absl_verbose() -> bool:
    """Whether absl's global --verbosity asks for tracebacks (train.py, bertjax.compile)."""
    from absl import flags

    return flags.FLAGS["verbosity"].present and flags.FLAGS.verbosity >= VERBOSE


def parse_flags(argv: list[str], flag_values=None, known_only: bool = False) -> list[str]:
    """``flag_values(argv)`` (absl's global flags by default; pass as `app.run`'s
    ``flags_parser`` there): a flag that does not exist or does not parse stops with `fail`."""
    from absl import flags

    flag_values = flags.FLAGS if flag_values is None else flag_values
    try:
        return flag_values(argv, known_only=known_only)
    except flags.Error as error:
        fail(str(error))


def new_flags(*specs: tuple):
    """A `flags.FlagValues` of a command with --help, --verbosity (-v) and a flag for each
    ``(name, default, help)`` of ``specs``: a bool flag for a bool default, an integer flag for
    an int default, else a string flag (None: no default)."""
    from absl import flags

    flag_values = flags.FlagValues()
    flags.DEFINE_bool("help", False, "Show this help.", flag_values=flag_values, short_name="?")
    flags.DEFINE_integer(
        "verbosity", 0, f"{VERBOSE}: print the traceback of an error", flag_values=flag_values,
        short_name="v",
    )  # fmt: skip
    for name, default, help_string in specs:
        define = flags.DEFINE_integer if isinstance(default, int) else flags.DEFINE_string
        define = flags.DEFINE_bool if isinstance(default, bool) else define
        define(name, default, help_string, flag_values=flag_values)
    return flag_values


def run(main: Callable, argv: list[str] | None, flag_values, doc: str, known_only: bool = False):
    """Parses ``argv`` (sys.argv by default) into ``flag_values`` (`new_flags`) and returns
    ``main(flag_values, rest)`` (``rest``: what the flags left, program name first), with this
    module's convention for bad flags and bad input. --help prints ``doc`` and the flags."""
    argv = list(sys.argv if argv is None else argv)
    rest = parse_flags(argv, flag_values, known_only)
    if flag_values.help:
        print(f"{doc.strip()}\n\nflags:\n{flag_values.get_help()}")
        raise SystemExit(0)
    if not known_only and len(rest) > 1:
        fail(f"unexpected arguments: {rest[1:]}")
    with input_errors(flag_values.verbosity >= VERBOSE):
        return main(flag_values, rest)


def require(flag_values, *names: str) -> None:
    """Stops naming the flags among ``names`` that were not given."""
    missing = [f"--{name}" for name in names if not flag_values[name].value]
    if missing:
        fail(f"{' '.join(missing)} needed (see --help)")


def beam_options(args: list[str], command: str) -> list[str]:
    """``args`` when Apache Beam knows each as a pipeline option; otherwise stops naming those
    it does not (a misspelled flag of ``command`` is not quietly dropped by Beam)."""
    import logging

    try:
        from apache_beam.options.pipeline_options import PipelineOptions
    except ImportError:
        fail(f"{command} with Beam options needs Apache Beam: pip install 'bertjax[beam]'")
    logger = logging.getLogger("apache_beam.options.pipeline_options")
    level = logger.level
    logger.setLevel(logging.ERROR)  # Beam's warning about the args fail() names below
    try:
        options = PipelineOptions(args)
        known = options.get_all_options()
        unknown = sorted(set(options.get_all_options(retain_unknown_options=True)) - set(known))
    finally:
        logger.setLevel(level)
    if unknown:
        names = ", ".join(f"--{name}" for name in unknown)
        fail(f"{names}: not a flag of {command} nor a Beam pipeline option (see --help)")
    return args


class ArgumentParser(argparse.ArgumentParser):
    """argparse with this module's convention: a bad argument is one line and exit status 2;
    ``-v 1`` (``--verbosity``) prints tracebacks (`input_errors(args.verbosity >= 1)`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.add_argument(
            "-v", "--verbosity", type=int, default=0, help=f"{VERBOSE}: print error tracebacks"
        )

    def error(self, message: str) -> NoReturn:
        fail(message)
