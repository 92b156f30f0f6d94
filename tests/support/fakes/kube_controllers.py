"""The controllers behind the fake API server (kube_api.py), for the parts of their behaviour that
envpipe-launch's workloads meet, written from the sources named at each one:

- the Job controller (kubernetes pkg/controller/job), for Indexed Jobs: pods named `<job>-<index>-<5 chars>`
  with hostname `<job>-<index>`, the completion-index annotation and label and the JOB_COMPLETION_INDEX
  variable; suspend (no pods; active ones deleted) and resume; podFailurePolicy (FailJob, Ignore,
  Count; onExitCodes and onPodConditions), backoffLimit, successPolicy (succeededIndexes,
  succeededCount), completions, activeDeadlineSeconds; lingering pods deleted once the Job finished;
  FailedCreate events when a pod is refused (quota, schema);
- the JobSet controller (kubernetes-sigs/jobset v0.12.0 pkg/controllers/jobset_controller.go):
  child Jobs `<jobset>-<replicated job>-<index>` with its labels and annotations, the headless Service
  `<subdomain>` (selector jobset-name), the pods' subdomain, suspend passed on to the Jobs, the first
  failed Job failing the JobSet (no failurePolicy), successPolicy operator All, active Jobs deleted
  once the JobSet finished;
- the TTL-after-finished controllers of both: the finished workload deleted after its TTL;
- Kueue (kueue.x-k8s.io): a workload labelled with a known LocalQueue is created suspended (Kueue's
  webhook) and unsuspended after the queue's admission delay; an unknown queue never admits.

Not modelled: restarts of a JobSet, elastic Jobs, pod finalizers, Kueue's Workload objects, quotas
and preemption, scheduling.
"""

from __future__ import annotations

import copy
import datetime
import secrets
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.support.fakes.kube_api import FakeKubeAPI

Obj = dict[str, Any]
INDEX_KEY = "batch.kubernetes.io/job-completion-index"
JOB_NAME_KEY = "batch.kubernetes.io/job-name"
CONTROLLER_UID_KEY = "batch.kubernetes.io/controller-uid"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOBSET_NAME_KEY = "jobset.sigs.k8s.io/jobset-name"
TERMINAL = ("Succeeded", "Failed")


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(obj: Obj, kind: str) -> Obj | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or []
                 if c["type"] == kind and c["status"] == "True"), None)


def set_condition(obj: Obj, kind: str, reason: str, message: str) -> None:
    conds = obj.setdefault("status", {}).setdefault("conditions", [])
    conds[:] = [c for c in conds if c["type"] != kind]
    conds.append({"type": kind, "status": "True", "reason": reason, "message": message,
                  "lastTransitionTime": now(), "lastProbeTime": now()})


def owner_ref(obj: Obj) -> Obj:
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


def owned(objs: Iterator[Obj], owner: Obj) -> list[Obj]:
    uid = owner["metadata"]["uid"]
    return [o for o in objs if any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or [])]


# ---- the Job controller ----
def default_job(job: Obj) -> None:
    """What the API server adds to a Job on create (pkg/apis/batch defaults and the generated selector)."""
    spec, uid, name = job["spec"], job["metadata"]["uid"], job["metadata"]["name"]
    spec.setdefault("suspend", False)
    spec.setdefault("backoffLimit", 6)
    spec.setdefault("completions", 1)
    spec.setdefault("parallelism", 1)
    spec.setdefault("completionMode", "NonIndexed")
    if not spec.get("manualSelector"):
        spec["selector"] = {"matchLabels": {CONTROLLER_UID_KEY: uid}}
        labels = spec["template"].setdefault("metadata", {}).setdefault("labels", {})
        labels.update({CONTROLLER_UID_KEY: uid, JOB_NAME_KEY: name, "controller-uid": uid, "job-name": name})
    job.setdefault("status", {})


def pod_for_index(job: Obj, index: int) -> Obj:
    """The pod the Job controller creates for `index` of an Indexed Job (job_controller.go, manageJob,
    and indexed_job_utils.go: annotation and label, JOB_COMPLETION_INDEX from the label, hostname)."""
    name = job["metadata"]["name"]
    template = copy.deepcopy(job["spec"]["template"])
    meta = template.get("metadata") or {}
    meta.setdefault("labels", {})[INDEX_KEY] = str(index)
    meta.setdefault("annotations", {})[INDEX_KEY] = str(index)
    spec = template["spec"]
    spec["hostname"] = f"{name}-{index}"
    for container in spec.get("initContainers", []) + spec["containers"]:
        env = container.setdefault("env", [])
        if not any(e["name"] == "JOB_COMPLETION_INDEX" for e in env):
            env.append({"name": "JOB_COMPLETION_INDEX",
                        "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{INDEX_KEY}']"}}})
    meta.update(name=f"{name}-{index}-{secrets.token_hex(3)[:5]}", namespace=job["metadata"]["namespace"],
                ownerReferences=[owner_ref(job)])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def _indexes(text: str) -> set[int]:
    """A successPolicy's succeededIndexes: "0,2-4"."""
    out: set[int] = set()
    for part in filter(None, text.split(",")):
        low, _, high = part.partition("-")
        out.update(range(int(low), int(high or low) + 1))
    return out


def _exit_code(pod: Obj, container: str | None) -> int | None:
    for cs in pod.get("status", {}).get("containerStatuses", []):
        term = cs.get("state", {}).get("terminated")
        if term is not None and term["exitCode"] != 0 and container in (None, cs["name"]):
            return int(term["exitCode"])
    return None


def match_failure_rule(job: Obj, pod: Obj) -> tuple[int, Obj, str] | None:
    """The first podFailurePolicy rule that matches a failed pod, with the controller's message."""
    ns, pname = pod["metadata"]["namespace"], pod["metadata"]["name"]
    for i, rule in enumerate(job["spec"].get("podFailurePolicy", {}).get("rules", [])):
        codes = rule.get("onExitCodes")
        if codes is not None:
            code = _exit_code(pod, codes.get("containerName"))
            if code is not None and (code in codes["values"]) == (codes["operator"] == "In"):
                container = codes.get("containerName") or pod["spec"]["containers"][0]["name"]
                return i, rule, (f"Container {container} for pod {ns}/{pname} failed with exit code {code} "
                                 f"matching {rule['action']} rule at index {i}")
        for pattern in rule.get("onPodConditions", []):
            for cond in pod.get("status", {}).get("conditions", []):
                if cond["type"] == pattern["type"] and cond["status"] == pattern.get("status", "True"):
                    return i, rule, (f"Pod {ns}/{pname} has condition {cond['type']} matching "
                                     f"{rule['action']} rule at index {i}")
    return None


class JobController:
    def __init__(self, api: FakeKubeAPI) -> None:
        self.api = api
        self.deadlines: set[str] = set()  # uids of Jobs whose activeDeadlineSeconds timer runs

    async def reconcile(self, ns: str, name: str) -> None:
        job = self.api.get("jobs", ns, name)
        if job is None:
            return
        spec, status = job["spec"], job.setdefault("status", {})
        pods = owned(self.api.items("pods", ns), job)
        active = [p for p in pods if p["status"]["phase"] not in TERMINAL]
        if condition(job, "Complete") or condition(job, "Failed"):
            for pod in active:  # the lingering pods of a finished Job
                await self.api.delete("pods", ns, pod["metadata"]["name"])
            self.api.expire_after(job, spec.get("ttlSecondsAfterFinished"))
            return
        if spec.get("suspend"):
            for pod in active:
                await self.api.delete("pods", ns, pod["metadata"]["name"])
            if not condition(job, "Suspended"):
                set_condition(job, "Suspended", "JobSuspended", "Job suspended")
                status.pop("startTime", None)
                await self.api.modified("jobs", job)
            return
        changed = False
        if condition(job, "Suspended"):
            job["status"]["conditions"] = [c for c in status["conditions"] if c["type"] != "Suspended"]
            changed = True
        if "startTime" not in status:
            status["startTime"] = now()
            changed = True
            deadline = spec.get("activeDeadlineSeconds")
            if deadline is not None and job["metadata"]["uid"] not in self.deadlines:
                self.deadlines.add(job["metadata"]["uid"])
                uid = job["metadata"]["uid"]
                self.api.later(deadline, lambda: self._deadline(ns, name, uid))
        failed = [p for p in pods if p["status"]["phase"] == "Failed"]
        counted = 0
        for pod in failed:
            matched = match_failure_rule(job, pod)
            action = matched[1]["action"] if matched else "Count"
            if action == "FailJob":
                assert matched is not None
                return await self._finish(job, active, "Failed", "PodFailurePolicy", matched[2])
            if action == "Count":
                counted += 1
        if counted > spec["backoffLimit"]:
            return await self._finish(job, active, "Failed", "BackoffLimitExceeded",
                                      "Job has reached the specified backoff limit")
        succeeded = {int(p["metadata"]["annotations"][INDEX_KEY]) for p in pods if p["status"]["phase"] == "Succeeded"}
        for i, rule in enumerate(spec.get("successPolicy", {}).get("rules", [])):
            want = _indexes(rule.get("succeededIndexes", ""))
            if want <= succeeded and len(succeeded & (want or succeeded)) >= rule.get("succeededCount", 0):
                return await self._finish(job, active, "Complete", "SuccessPolicy", f"Matched rules at index {i}")
        if len(succeeded) >= spec["completions"]:
            return await self._finish(job, active, "Complete", "CompletionsReached", "Reached expected number of "
                                      "succeeded pods")
        status.update(active=len(active), succeeded=len(succeeded), failed=len(failed))
        have = {int(p["metadata"]["annotations"][INDEX_KEY]) for p in active} | succeeded
        for index in range(spec["completions"]):
            if index not in have and len(active) < spec["parallelism"]:
                pod = pod_for_index(job, index)
                if await self.api.create_by_controller("pods", ns, pod, job):
                    active.append(pod)
        if changed:
            await self.api.modified("jobs", job)

    async def _finish(self, job: Obj, active: list[Obj], kind: str, reason: str, message: str) -> None:
        """Complete or Failed; the interim condition first (SuccessCriteriaMet / FailureTarget), then
        the lingering pods deleted, as the Job controller does."""
        interim = "SuccessCriteriaMet" if kind == "Complete" else "FailureTarget"
        set_condition(job, interim, reason, message)
        ns = job["metadata"]["namespace"]
        for pod in active:
            await self.api.delete("pods", ns, pod["metadata"]["name"])
        set_condition(job, kind, reason, message)
        job["status"]["active"] = 0
        if kind == "Complete":
            job["status"]["completionTime"] = now()
        await self.api.modified("jobs", job)
        self.api.expire_after(job, job["spec"].get("ttlSecondsAfterFinished"))

    async def _deadline(self, ns: str, name: str, uid: str) -> None:
        job = self.api.get("jobs", ns, name)
        if job is None or job["metadata"]["uid"] != uid or condition(job, "Complete") or condition(job, "Failed"):
            return
        active = [p for p in owned(self.api.items("pods", ns), job) if p["status"]["phase"] not in TERMINAL]
        await self._finish(job, active, "Failed", "DeadlineExceeded", "Job was active longer than specified deadline")


# ---- the JobSet controller ----
def default_jobset(js: Obj) -> None:
    """JobSet's defaulting webhook (pkg/webhooks/jobset_webhook.go, Default)."""
    spec = js["spec"]
    spec.setdefault("successPolicy", {"operator": "All"})
    spec.setdefault("startupPolicy", {"startupPolicyOrder": "AnyOrder"})
    for rjob in spec["replicatedJobs"]:
        rjob["template"]["spec"].setdefault("completionMode", "Indexed")
        rjob["template"]["spec"]["template"]["spec"].setdefault("restartPolicy", "OnFailure")
    network = spec.setdefault("network", {})
    network.setdefault("enableDNSHostnames", True)
    network.setdefault("publishNotReadyAddresses", True)
    js.setdefault("status", {})


def _subdomain(js: Obj) -> str:
    return js["spec"]["network"].get("subdomain") or js["metadata"]["name"]


def child_job(js: Obj, rjob: Obj, index: int) -> Obj:
    """constructJob and labelAndAnnotateObject of the JobSet controller, for what this fake models."""
    name = f"{js['metadata']['name']}-{rjob['name']}-{index}"
    keys = {JOBSET_NAME_KEY: js["metadata"]["name"], "jobset.sigs.k8s.io/jobset-uid": js["metadata"]["uid"],
            "jobset.sigs.k8s.io/replicatedjob-name": rjob["name"],
            "jobset.sigs.k8s.io/replicatedjob-replicas": str(rjob["replicas"]),
            "jobset.sigs.k8s.io/job-index": str(index), "jobset.sigs.k8s.io/restart-attempt": "0"}
    template = copy.deepcopy(rjob["template"])
    meta = template.get("metadata") or {}
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": name, "namespace": js["metadata"]["namespace"],
                        "labels": {**meta.get("labels", {}), **keys},
                        "annotations": {**meta.get("annotations", {}), **keys},
                        "ownerReferences": [owner_ref(js)]},
           "spec": template["spec"]}
    pod_meta = job["spec"]["template"].setdefault("metadata", {})
    pod_meta["labels"] = {**pod_meta.get("labels", {}), **keys}
    pod_meta["annotations"] = {**pod_meta.get("annotations", {}), **keys}
    if js["spec"]["network"].get("enableDNSHostnames"):
        job["spec"]["template"]["spec"]["subdomain"] = _subdomain(js)
    job["spec"]["suspend"] = bool(js["spec"].get("suspend"))
    return job


class JobSetController:
    def __init__(self, api: FakeKubeAPI) -> None:
        self.api = api

    async def reconcile(self, ns: str, name: str) -> None:
        js = self.api.get("jobsets", ns, name)
        if js is None:
            return
        jobs = owned(self.api.items("jobs", ns), js)
        active = [j for j in jobs if not (condition(j, "Complete") or condition(j, "Failed"))]
        if condition(js, "Completed") or condition(js, "Failed"):
            for job in active:
                await self.api.delete("jobs", ns, job["metadata"]["name"])
            self.api.expire_after(js, js["spec"].get("ttlSecondsAfterFinished"))
            return
        failed = [j for j in jobs if condition(j, "Failed")]
        if failed:  # no failurePolicy: the JobSet fails with its first failed Job
            first = min(failed, key=lambda j: condition(j, "Failed")["lastTransitionTime"])  # type: ignore[index]
            return await self._finish(js, active, "Failed", "FailedJobs",
                                      f"jobset failed due to one or more job failures, first failed job: "
                                      f"{first['metadata']['name']}")
        total = sum(r["replicas"] for r in js["spec"]["replicatedJobs"]
                    if r["name"] in (js["spec"]["successPolicy"].get("targetReplicatedJobs") or [r["name"]]))
        done = [j for j in jobs if condition(j, "Complete")]
        if jobs and len(done) >= total and js["spec"]["successPolicy"]["operator"] == "All":
            return await self._finish(js, active, "Completed", "AllJobsCompleted", "jobset completed successfully")
        if js["spec"]["network"].get("enableDNSHostnames") and self.api.get("services", ns, _subdomain(js)) is None:
            svc = {"apiVersion": "v1", "kind": "Service",
                   "metadata": {"name": _subdomain(js), "namespace": ns, "ownerReferences": [owner_ref(js)]},
                   "spec": {"clusterIP": "None", "selector": {JOBSET_NAME_KEY: name},
                            "publishNotReadyAddresses": js["spec"]["network"]["publishNotReadyAddresses"]}}
            await self.api.create_by_controller("services", ns, svc, js)
        names = {j["metadata"]["name"] for j in jobs}
        for rjob in js["spec"]["replicatedJobs"]:
            for index in range(rjob["replicas"]):
                job = child_job(js, rjob, index)
                if job["metadata"]["name"] not in names:
                    await self.api.create_by_controller("jobs", ns, job, js)
        suspend = bool(js["spec"].get("suspend"))
        for job in active:
            if bool(job["spec"].get("suspend")) != suspend:
                job["spec"]["suspend"] = suspend
                await self.api.modified("jobs", job)

    async def _finish(self, js: Obj, active: list[Obj], kind: str, reason: str, message: str) -> None:
        set_condition(js, kind, reason, message)
        js["status"]["terminalState"] = kind
        ns = js["metadata"]["namespace"]
        for job in active:
            await self.api.delete("jobs", ns, job["metadata"]["name"])
        await self.api.modified("jobsets", js)
        self.api.expire_after(js, js["spec"].get("ttlSecondsAfterFinished"))


# ---- Kueue ----
class FakeKueue:
    """LocalQueues by name, each with an admission delay in seconds."""

    def __init__(self, api: FakeKubeAPI, queues: dict[str, float]) -> None:
        self.api, self.queues = api, queues
        self.admitted: list[str] = []  # "<plural>/<name>", in admission order

    @staticmethod
    def queue_of(obj: Obj) -> str | None:
        if obj["metadata"].get("ownerReferences"):  # a JobSet's Jobs are admitted with the JobSet
            return None
        return (obj["metadata"].get("labels") or {}).get(QUEUE_LABEL)

    def on_create(self, obj: Obj) -> None:
        """Kueue's mutating webhook: a queued workload starts suspended."""
        if self.queue_of(obj) is not None:
            obj["spec"]["suspend"] = True

    def watch(self, plural: str, obj: Obj) -> None:
        queue = self.queue_of(obj)
        if queue in self.queues:
            key = f"{plural}/{obj['metadata']['name']}"
            if key not in self.admitted:
                self.admitted.append(key)
                ns, name, uid = obj["metadata"]["namespace"], obj["metadata"]["name"], obj["metadata"]["uid"]
                self.api.later(self.queues[queue], lambda: self._admit(plural, ns, name, uid))

    async def _admit(self, plural: str, ns: str, name: str, uid: str) -> None:
        obj = self.api.get(plural, ns, name)
        if obj is not None and obj["metadata"]["uid"] == uid and obj["spec"].get("suspend"):
            obj["spec"]["suspend"] = False
            await self.api.modified(plural, obj)

