"""Collects the raw texts of the built-in corpus; run as a script in a clean interpreter.

Other libraries patch the standard library at import time (torch replaces inspect.getfile,
transformers adds logging.Logger.warning_advice), so the docstrings are read in a fresh
`python -I -S` process that imports nothing but the standard library: the corpus is then
the same whatever the calling process imported. Prints JSON [[doc_id, text], ...].
"""

import importlib
import inspect
import json
import sys
import warnings
from collections.abc import Iterator

# Modules that import without side effects on every supported platform; sorted, never reordered.
STDLIB_MODULES = tuple(
    sorted(
        (
            "abc",
            "argparse",
            "ast",
            "asyncio.events",
            "asyncio.locks",
            "asyncio.queues",
            "asyncio.streams",
            "asyncio.tasks",
            "base64",
            "bdb",
            "bisect",
            "bz2",
            "calendar",
            "cmd",
            "codecs",
            "collections",
            "concurrent.futures._base",
            "configparser",
            "contextlib",
            "copy",
            "csv",
            "dataclasses",
            "datetime",
            "decimal",
            "difflib",
            "dis",
            "doctest",
            "email.message",
            "email.utils",
            "enum",
            "filecmp",
            "fileinput",
            "fnmatch",
            "fractions",
            "ftplib",
            "functools",
            "gettext",
            "glob",
            "gzip",
            "hashlib",
            "heapq",
            "hmac",
            "html.parser",
            "http.client",
            "http.cookiejar",
            "http.server",
            "imaplib",
            "inspect",
            "io",
            "ipaddress",
            "itertools",
            "json",
            "json.decoder",
            "json.encoder",
            "locale",
            "logging",
            "logging.handlers",
            "lzma",
            "mailbox",
            "math",
            "mimetypes",
            "multiprocessing.pool",
            "netrc",
            "numbers",
            "operator",
            "optparse",
            "os",
            "pathlib",
            "pdb",
            "pickle",
            "pickletools",
            "platform",
            "plistlib",
            "poplib",
            "pprint",
            "profile",
            "pstats",
            "queue",
            "quopri",
            "random",
            "re",
            "reprlib",
            "sched",
            "secrets",
            "selectors",
            "shelve",
            "shlex",
            "shutil",
            "smtplib",
            "socket",
            "socketserver",
            "sqlite3",
            "ssl",
            "statistics",
            "string",
            "struct",
            "subprocess",
            "symtable",
            "tarfile",
            "tempfile",
            "textwrap",
            "threading",
            "timeit",
            "tokenize",
            "trace",
            "traceback",
            "types",
            "typing",
            "unittest.case",
            "unittest.mock",
            "urllib.parse",
            "urllib.request",
            "uuid",
            "warnings",
            "wave",
            "weakref",
            "xml.dom.minidom",
            "xml.etree.ElementTree",
            "zipfile",
            "zoneinfo",
        )
    )
)


def _import(name: str):
    """Imports a stdlib module quietly; None if this Python lacks it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return importlib.import_module(name)
        except (
            Exception
        ):  # a module missing on this platform/build is simply not part of the corpus
            return None


def _member_docs(module) -> Iterator[tuple[str, str]]:
    """(qualified name, docstring) of a module's own classes, functions and methods, sorted."""
    for name, obj in sorted(vars(module).items()):
        if (
            not (inspect.isclass(obj) or inspect.isfunction(obj))
            or getattr(obj, "__module__", None) != module.__name__
        ):
            continue
        if getattr(obj, "__name__", None) != name:  # an alias such as logging._loggerClass
            continue
        if isinstance(obj.__doc__, str):
            yield f"{module.__name__}.{name}", obj.__doc__
        if inspect.isclass(obj):
            for attr, member in sorted(vars(obj).items()):
                member = getattr(member, "__func__", member)  # classmethod / staticmethod
                member = getattr(member, "fget", member)  # property
                if inspect.isfunction(member) and isinstance(member.__doc__, str):
                    yield f"{module.__name__}.{name}.{attr}", member.__doc__


def raw_documents():
    """(doc_id, raw text) in a fixed order: pydoc topics, then module and member docstrings."""
    from pydoc_data.topics import topics

    out = [(f"topic:{key}", topics[key]) for key in sorted(topics)]
    for module_name in STDLIB_MODULES:
        module = _import(module_name)
        if module is None:
            continue
        docs = [(module_name, module.__doc__)] if isinstance(module.__doc__, str) else []
        with warnings.catch_warnings():  # e.g. typing.io warns when its docstring is read
            warnings.simplefilter("ignore")
            docs += list(_member_docs(module))
        out += [(f"doc:{doc_id}", text) for doc_id, text in docs]
    return out


if __name__ == "__main__":
    json.dump(raw_documents(), sys.stdout)
