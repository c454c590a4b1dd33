"""Secrets for the job: resolved on the controller (its environment, or Secret Manager for
``NAME=sm://SECRET[/VERSION]``), held only in process memory, sent to each node on the SSH
channel's stdin into the detached start — never into argv, run.sh, the run snapshot or any file —
and redacted from every line shown or logged.

On the node the start command reads ``NAME BASE64`` lines up to an empty line and exports them
(shell builtins only: no process gets a value in its argv); run.sh then pipes its own output through
an awk filter that reads the values from its environment and prints ``***`` for each.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable, Iterable, Mapping, Sequence

from gputrain_node.contract import SECRET_ENDPOINT_ENV, SECRET_REFS_ENV
from infra.base.errors import UserError
from infra.secret_refs import SM_SCHEME as SM_SCHEME  # re-exported: parsing lives in infra
from infra.secret_refs import SecretRef
from infra.secret_refs import parse_secret as parse_secret
from infra.secret_refs import parse_secrets as parse_secrets

#: Where the Secret Manager client goes instead of Google (a private endpoint; the tests' fake).
ENDPOINT_ENV = SECRET_ENDPOINT_ENV
REDACTED = "***"
NAMES_ENV = "GPUTRAIN_SECRET_NAMES"  # names only (never values): what run.sh's filter redacts

SecretFetcher = Callable[[str, str, str], str]  # (project, secret, version) -> value


def resolve_secrets(
    refs: Sequence[SecretRef],
    *,
    project: str | None,
    environ: Mapping[str, str] | None = None,
    fetch: SecretFetcher | None = None,
) -> dict[str, str]:
    """Every value, or UserError naming the first secret that cannot be had (before anything is
    created)."""
    env = os.environ if environ is None else environ
    values: dict[str, str] = {}
    for ref in refs:
        if ref.sm_secret is None:
            value = env.get(ref.name)
            if value is None:
                raise UserError(
                    f"secret {ref.name}: the environment variable {ref.name} is not set here; "
                    f"export it before the command, or declare {ref.name}=sm://SECRET[/VERSION]"
                )
            values[ref.name] = value
            continue
        where = ref.sm_project or project or env.get("GOOGLE_CLOUD_PROJECT")
        if not where:
            raise UserError(
                f"secret {ref.name}: sm://{ref.sm_secret} needs a project; use "
                "sm://projects/PROJECT/secrets/SECRET or set GOOGLE_CLOUD_PROJECT"
            )
        values[ref.name] = (fetch or fetch_secret_manager)(where, ref.sm_secret, ref.sm_version)
    return values


#: How long a secret's read may retry an unreachable or unavailable Secret Manager (the
#: client's own default is 60 s of retries, then a traceback).
SECRET_DEADLINE_S = 30.0


def fetch_secret_manager(
    project: str, secret: str, version: str, *, deadline_s: float = SECRET_DEADLINE_S
) -> str:
    """One secret version's payload from Secret Manager; UserError for a missing secret, a
    refused access or a Secret Manager that does not answer (one line: the resource, the fix)."""
    from google.api_core import exceptions as gexc
    from google.api_core.retry import Retry, if_transient_error
    from google.cloud import secretmanager

    from infra.gcp.api import unreachable

    endpoint = os.environ.get(ENDPOINT_ENV)
    if endpoint:
        from google.api_core.client_options import ClientOptions
        from google.auth.credentials import AnonymousCredentials

        client = secretmanager.SecretManagerServiceClient(
            credentials=AnonymousCredentials(),
            transport="rest",
            client_options=ClientOptions(api_endpoint=endpoint),
        )
    else:
        client = secretmanager.SecretManagerServiceClient()
    resource = f"projects/{project}/secrets/{secret}/versions/{version}"
    retry = Retry(predicate=if_transient_error).with_deadline(deadline_s)
    try:
        answer = client.access_secret_version(name=resource, timeout=deadline_s, retry=retry)
    except gexc.NotFound:
        raise UserError(
            f"secret {resource}: not found in Secret Manager; create it with `gcloud secrets "
            f"create {secret} --project {project}` and add a version"
        ) from None
    except (gexc.Forbidden, gexc.Unauthorized) as e:  # also PermissionDenied, Unauthenticated
        raise UserError(
            f"secret {resource}: access refused ({e.message}); grant roles/secretmanager."
            "secretAccessor on it to your account"
        ) from None
    except (gexc.GoogleAPIError, OSError) as e:  # RetryError, 5xx, a refused connection
        raise UserError(
            f"secret {resource}: Secret Manager did not answer ({unreachable(e)}); check this "
            "machine's network or proxy and run again"
        ) from None
    return bytes(answer.payload.data).decode("utf-8")


SECRETS_HEADER = "#gputrain-secrets"


#: Vertex: the job's body carries references only (SECRET_REFS_ENV; the node package's Vertex
#: entry resolves them).


def secret_references(refs: Sequence[SecretRef], project: str | None) -> dict[str, str]:
    """name -> `projects/P/secrets/S/versions/V` for a job that resolves its own secrets
    (Vertex); UserError for a secret that is not in Secret Manager (a value of this machine's
    environment cannot reach the job without being written into its body)."""
    out: dict[str, str] = {}
    for ref in refs:
        if ref.sm_secret is None:
            raise UserError(
                f"secret {ref.name}: on backend: vertex a secret must come from Secret Manager "
                f"({ref.name}=sm://SECRET[/VERSION]): the job reads it there itself"
            )
        where = ref.sm_project or project
        if not where:
            raise UserError(f"secret {ref.name}: sm://{ref.sm_secret} needs a project")
        out[ref.name] = f"projects/{where}/secrets/{ref.sm_secret}/versions/{ref.sm_version}"
    return out


def machine_secrets_line(names: Iterable[str], in_secret_manager: Iterable[str]) -> str | None:
    """Why a `gputrain reconcile` pass on another machine cannot relaunch a run whose secrets
    `names` are not all in Secret Manager: a value of this machine's environment never leaves
    it. None when every secret is a reference. Pure."""
    here = sorted(set(names) - set(in_secret_manager))
    if not here:
        return None
    return (
        f"with secrets from this machine's environment ({', '.join(here)}) a pass cannot "
        f"relaunch this run; use NAME=sm://SECRET[/VERSION] for {', '.join(here)}"
    )


def read_secret_references(
    refs: Mapping[str, str], fetch: SecretFetcher | None = None
) -> dict[str, str]:
    """name -> value of each `projects/P/secrets/S/versions/V` reference (what a reconcile pass
    reads itself, as the launch's controller did); UserError as fetch_secret_manager's."""
    values = {}
    for name, ref in refs.items():
        _, project, _, secret, _, version = ref.split("/")
        values[name] = (fetch or fetch_secret_manager)(project, secret, version)
    return values


def secret_refs_env(refs: Mapping[str, str]) -> dict[str, str]:
    import json

    return {SECRET_REFS_ENV: json.dumps(dict(refs), sort_keys=True)} if refs else {}


def secret_stdin(values: Mapping[str, str]) -> bytes:
    """What precedes run.sh on the start command's stdin when there are secrets: a header line,
    ``NAME BASE64`` lines, an empty line (nothing without secrets)."""
    if not values:
        return b""
    lines = [f"{k} {base64.b64encode(v.encode()).decode()}\n" for k, v in values.items()]
    return (f"{SECRETS_HEADER}\n" + "".join(lines) + "\n").encode()


#: The start command's first step when there are secrets (a format string: {failed} is its exit
#: status for a stdin without them): export each secret read from stdin, in shell builtins only
#: (its own variables are GPUTRAIN_*, a prefix no secret may take, so none is overwritten)
#: (`read`, `printf`, `export`; base64 reads the value on its stdin, never in argv). `read` takes
#: the lines byte by byte, so what follows the empty line (the code bundle) is left for the unpack.
READ_SECRETS_SH = (
    f"{NAMES_ENV}=''; IFS= read -r GPUTRAIN_H; [ \"$GPUTRAIN_H\" = '{SECRETS_HEADER}' ] || "
    "exit {failed}; while IFS=' ' read -r GPUTRAIN_N GPUTRAIN_V && [ -n \"$GPUTRAIN_N\" ]; do "
    'GPUTRAIN_V=$(printf "%s" "$GPUTRAIN_V" | base64 -d) || exit {failed}; '
    'export "$GPUTRAIN_N=$GPUTRAIN_V"; '
    f'{NAMES_ENV}="${NAMES_ENV} $GPUTRAIN_N"; done; export {NAMES_ENV}; '
    "unset GPUTRAIN_H GPUTRAIN_N GPUTRAIN_V; "
)

#: run.sh's own output (and so torchrun's and every rank's) through a filter that prints *** for
#: each value, line by line (awk reads them from its environment): the node's log never holds one.
REDACT_OUTPUT_SH = f"""if [ -n "${{{NAMES_ENV}:-}}" ]; then
  rm -f "$RUN/.redact"; mkfifo "$RUN/.redact"
  AWK=awk; case $(awk -W version 2>&1) in *mawk*) AWK="awk -W interactive";; esac  # line by line
  $AWK 'BEGIN {{ n = split(ENVIRON["{NAMES_ENV}"], names, " "); k = 0
       for (i = 1; i <= n; i++) {{ m = split(ENVIRON[names[i]], parts, "\\n")
         for (j = 1; j <= m; j++) if (parts[j] != "") pieces[++k] = parts[j] }} }}
  {{ line = $0
     for (i = 1; i <= k; i++) {{ v = pieces[i]; out = ""
       while ((j = index(line, v)) > 0) {{ out = out substr(line, 1, j - 1) "{REDACTED}"; line = substr(line, j + length(v)) }}
       line = out line }}
     print line; fflush() }}' < "$RUN/.redact" &
  exec > "$RUN/.redact" 2>&1
  rm -f "$RUN/.redact"
fi
"""


def redact(text: str, values: Iterable[str]) -> str:
    """Every occurrence of every value (and of each line of a multi-line one) replaced by ***,
    the longest first."""
    pieces = {p for v in values for p in [v, *v.splitlines()] if p}
    for v in sorted(pieces, key=len, reverse=True):
        text = text.replace(v, REDACTED)
    return text


def redacting(
    sink: Callable[[str, str], None], values: Iterable[str]
) -> Callable[[str, str], None]:
    """`sink` with every secret value redacted from its lines (the same sink without secrets)."""
    secrets = tuple(v for v in values if v)
    if not secrets:
        return sink

    def redacted(node: str, line: str) -> None:
        sink(node, redact(line, secrets))

    return redacted
