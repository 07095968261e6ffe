"""The downward API reader's old name: it lives in :mod:`joblease.pod.downward` now.

Kept because it is public API: the README, docs/sdk.md, docs/helm.md and the examples
imported ``TokenFile`` from here, and that code runs in users' pod images, which upgrade on
their own schedule. New code imports ``joblease.pod.downward``.
"""

from joblease.pod.downward import DEFAULT_PATH as DEFAULT_PATH
from joblease.pod.downward import DelegatedToken as DelegatedToken
from joblease.pod.downward import DownwardFormatError as DownwardFormatError
from joblease.pod.downward import TokenFile as TokenFile
from joblease.pod.downward import go_unquote as go_unquote
from joblease.pod.downward import parse_annotations as parse_annotations
from joblease.pod.downward import token_from_annotations as token_from_annotations

__all__ = ["DEFAULT_PATH", "DelegatedToken", "DownwardFormatError", "TokenFile",
           "go_unquote", "parse_annotations", "token_from_annotations"]
