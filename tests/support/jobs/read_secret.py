"""A rank that reads the secret named by $SECRET_NAME, prints it (a log line that must arrive
redacted) and writes only its hash to the out dir."""

import hashlib
import json
import os
from pathlib import Path

value = os.environ[os.environ["SECRET_NAME"]]
print(f"the token is {value.splitlines()[0]}", flush=True)
if os.environ.get("RANK", "0") == "0":
    digest = hashlib.sha256(value.encode()).hexdigest()
    (Path(os.environ["GPUTRAIN_OUT"]) / "secret.json").write_text(json.dumps({"sha256": digest}))
