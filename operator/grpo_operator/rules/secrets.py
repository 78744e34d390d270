"""Keys belong in Secrets: a literal value for a credential in spec.template.env is refused (pure).

A literal env value is part of the GRPOJob and of every pod spec: anyone who may read them (get grpojobs, get pods,
`kubectl describe`, a GitOps repository) reads the key. A Secret referenced with valueFrom.secretKeyRef is not copied
anywhere. Tracking integrations (wandb, trackio Spaces, mlflow, …) and the Hub read their keys from these variables.
"""

from __future__ import annotations

import re

from .. import api

# Variables known to hold a credential (Hugging Face, the report_to integrations, object stores).
KNOWN = frozenset({
    "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_HUB_TOKEN", "HF_API_TOKEN",
    "WANDB_API_KEY", "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_PASSWORD", "COMET_API_KEY", "NEPTUNE_API_TOKEN",
    "CLEARML_API_ACCESS_KEY", "CLEARML_API_SECRET_KEY", "SWANLAB_API_KEY", "DAGSHUB_USER_TOKEN",
    "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AZURE_STORAGE_KEY", "AZURE_CLIENT_SECRET", "GITHUB_TOKEN",
    "OPENAI_API_KEY",
})
# ...and any name shaped like one (HF_HUB_DISABLE_IMPLICIT_TOKEN=1 is a switch, not a key: no bare *_TOKEN rule)
SHAPED = re.compile(r"(_API_KEY|_SECRET_KEY|_SECRET|_PASSWORD|_ACCESS_TOKEN|_API_TOKEN|_AUTH_TOKEN)$")


def is_secret_name(name: str) -> bool:
    upper = name.upper()
    return upper in KNOWN or SHAPED.search(upper) is not None


# from_pretrained keyword arguments that carry a Hub token: in modelInitKwargs it lands in the job's ConfigMap
TOKEN_KWARGS = ("token", "use_auth_token")


def literal_secret_errors(spec: api.GRPOJobSpec) -> list[tuple[str, str]]:
    """(field, message) for every spec.template.env entry that gives a credential as a literal value, and a token
    given in training.modelInitKwargs."""
    init = getattr(spec.training, "modelInitKwargs", None)
    errors = [(f"spec.training.modelInitKwargs.{key}",
               "a Hub token in modelInitKwargs is stored in the GRPOJob and its ConfigMap, readable by anyone who can "
               "read them; put the token in a Secret and set spec.hfTokenSecretRef: {name: <secret>, key: <key>} "
               "(it reaches the pods as HF_TOKEN)")
              for key in TOKEN_KWARGS if isinstance(init, dict) and isinstance(init.get(key), str)]
    for i, e in enumerate(spec.template.env):
        if not e.value or not is_secret_name(e.name):
            continue
        if e.name.upper() in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
            fix = "put the token in a Secret and set spec.hfTokenSecretRef: {name: <secret>, key: <key>}"
        else:
            fix = (f"put it in a Secret (kubectl create secret generic <secret> --from-literal=<key>=…) and write "
                   f"{{name: {e.name}, valueFrom: {{secretKeyRef: {{name: <secret>, key: <key>}}}}}}")
        errors.append((f"spec.template.env[{i}].value", f"{e.name} holds a credential: a literal value is stored in the "
                       f"GRPOJob and every pod spec, readable by anyone who can read them; {fix}"))
    return errors
