"""Offline schema checks of the objects the launcher makes, as strict as `kubectl apply` (whose default
server-side field validation refuses unknown fields):

- Kubernetes' own kinds (Pod, Service, Secret, ConfigMap, batch/v1 Job): the official OpenAPI schemas
  of a Kubernetes version that kubernetes-validate ships (K8S_VERSION unless told; OLDEST and NEWEST bound
  what the launcher supports), in their strict form;
- JobSet (jobset.x-k8s.io/v1alpha2): the openAPIV3Schema of JobSet's CRD, vendored in
  jobset_v1alpha2.json (release, commit and source URL inside; only its prose `description` fields
  were dropped), made strict the same way: an object schema with `properties` and no
  `additionalProperties` admits no other field, as the API server's structural pruning would drop
  them. The CRD leaves `metadata` to the API server, so it is checked against the official ObjectMeta,
  and each replicated Job's template against the official batch/v1 Job schema too.

Not checked: the CRD's CEL rules (x-kubernetes-validations) and the admission webhooks of JobSet or
Kueue. To update the JobSet schema: take `spec.versions[0].schema.openAPIV3Schema` of
config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml at a JobSet release tag, drop the string
`description` fields, and record the tag and commit in the file.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate

K8S_VERSION = "1.33"
OLDEST = "1.27"  # the oldest Kubernetes the launcher supports (launcher/envpipe_launch/kube_version.py MIN)
NEWEST = ".".join(kubernetes_validate.utils.latest_version().split(".")[:2])  # the newest schema it ships
JOBSET_API = "jobset.x-k8s.io/v1alpha2"
JOBSET_SCHEMA = Path(__file__).with_name("jobset_v1alpha2.json")
Obj = dict[str, Any]


class Invalid(Exception):
    """The object fails its schema; the message says where, like the API server's 422."""


def _strict(schema: Any) -> Any:
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if "properties" in schema and "additionalProperties" not in schema:
        out["additionalProperties"] = False
    return out


@functools.cache
def _jobset_validator() -> jsonschema.Draft202012Validator:
    doc = json.loads(JOBSET_SCHEMA.read_text())
    assert doc["apiVersion"] == JOBSET_API, doc["apiVersion"]
    return jsonschema.Draft202012Validator(_strict(doc["openAPIV3Schema"]))


def _official(obj: Obj, version: str) -> None:
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        where = ".".join(str(p) for p in e.absolute_path)
        raise Invalid(f"{where}: {e.message}" if where else e.message) from e
    except kubernetes_validate.SchemaNotFoundError as e:
        raise Invalid(e.message) from e


def _jobset(obj: Obj, version: str) -> None:
    error = jsonschema.exceptions.best_match(_jobset_validator().iter_errors(obj))
    if error is not None:
        where = ".".join(str(p) for p in error.absolute_path)
        raise Invalid(f"{where}: {error.message}" if where else error.message)
    # the parts the CRD leaves to the API server, against the official schemas
    _official({"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]}, version)
    for i, rjob in enumerate(obj["spec"]["replicatedJobs"]):
        template = copy.deepcopy(rjob["template"])
        try:
            _official({"apiVersion": "batch/v1", "kind": "Job", "metadata": template.get("metadata", {}),
                       "spec": template["spec"]}, version)
        except Invalid as e:
            raise Invalid(f"spec.replicatedJobs.{i}.template: {e}") from e


def validate(obj: Obj, version: str = K8S_VERSION) -> None:
    """Raise Invalid unless `obj` passes the schema of its kind in Kubernetes `version` ("1.27")."""
    if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
        raise Invalid("an object needs apiVersion, kind and metadata")
    if obj.get("apiVersion") == JOBSET_API and obj.get("kind") == "JobSet":
        _jobset(obj, version)
    else:
        _official(obj, version)
