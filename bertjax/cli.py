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
printed only with ``--verbosity=1`` (``-v 1``). What an error is, bertjax/errors.py decides:
bad input is what bertjax raises for it (ValueError and OSError: FileNotFoundError,
`bertjax.paths.MissingPathError`, whose messages name what and where) unless its chain holds a
storage error that may go away (a connection reset, a 503: status 75, rerun) or the runtime's
(a failed collective); anything else keeps its traceback. README's exit table is
`bertjax.errors.table_markdown()`.

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

from bertjax import errors

FINISHED = errors.FINISHED
BUG = errors.BUG  # an uncaught exception (Python's status)
BAD_INPUT = errors.BAD_INPUT  # the exit status of every command stopped by bad input
RETRY = errors.RETRY  # EX_TEMPFAIL: storage unreachable past its budget, or a lost process
STOPPED = errors.stopped_by(15)  # stopped by SIGTERM after saving (or another was signalled)


def stopped_by(signum: int | None) -> int:
    """The exit status of a run stopped by signal ``signum`` after saving (None: another
    process of the run was signalled): 128 + the signal, as a shell reports a signal's kill."""
    return STOPPED if signum is None else errors.stopped_by(signum)


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
    """Inside, an error ends the command as bertjax/errors.py classifies it: bad input with
    `fail` (status 2), storage that did not answer (a `Retryable`, or a transient error that
    reached this far) with `unavailable` (status 75), each as one line; the runtime's failures
    and bugs keep their traceback (status 1). ``verbose``: every traceback.
    The line ends saying how to get the traceback: the same exception types can come from a
    bug rather than from bad input, and the traceback is what a report needs."""
    try:
        yield
    except Exception as error:
        kind = errors.classify(error)
        if verbose or kind in (errors.Kind.RUNTIME, errors.Kind.BUG):
            raise
        if kind is errors.Kind.INPUT:
            fail(f"{str(error) or type(error).__name__} (--verbosity=1 prints the traceback)")
        unavailable(error)


def unavailable(error: BaseException) -> NoReturn:
    """Stops the command: ``error: MESSAGE`` (one line) on stderr, exit status `RETRY`. A
    transient error that was not retried where it happened says so."""
    line = " ".join(str(error).split())
    if not isinstance(error, errors.Retryable):
        cause = errors.transient_cause(error) or error
        what = " ".join(f"{type(cause).__name__}: {cause}".split())[:300]
        line = (f"storage did not answer ({what}){': ' + line if cause is not error else ''}; "
                "the object is not known to be bad: rerun the same command when storage "
                "answers again (the run resumes from its last checkpoint)")  # fmt: skip
    print(f"error: {line}", file=sys.stderr)
    raise SystemExit(errors.exit_status(error))


def absl_verbose() -> bool:
    """Whether absl's global --verbosity asks for tracebacks (train.py, bertjax.compile)."""
    from absl import flags

    return flags.FLAGS["verbosity"].present and flags.FLAGS.verbosity >= VERBOSE


def parse_flags(argv: list[str], flag_values=None, known_only: bool = False) -> list[str]:
    """``flag_values(argv)`` (absl's global flags by default; pass as `app.run`'s
    ``flags_parser`` there): a flag that does not exist or does not parse stops with `fail`.
    Every command starts here, so it also sets the process's garbage collection for tracing
    (`bertjax.training.runtime.fewer_gc_passes`)."""
    from absl import flags

    from bertjax.training import runtime

    runtime.fewer_gc_passes()
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
