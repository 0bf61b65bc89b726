#!/usr/bin/env python3
"""Static checks of deploy/: systemd units, Dockerfiles, Kubernetes manifests, the
Prometheus config and the Grafana dashboard. Docker and Kubernetes cannot run on the CI
machine, so these checks stand in for them (deploy/docker/README.md, deploy/k8s/README.md).

  deploy_check.py ROOT systemd|docker|k8s|prometheus|grafana [--router-bin B] [--worker-bin B]

Every KVFLEET_* variable the deploy files set must carry the prefix of the binary it
configures (KVFLEET_ROUTER_, KVFLEET_WORKER_) and name one of its flags (common/config.h's rule). The flags come from `--help` of the built binaries when given,
else from the static lists below (read from router/main.cc and worker/server/worker_config.cc).
Exit 0: pass; 1: a finding (each printed); 77: a tool the check needs is missing (skip).
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

SKIP = 77
COMMON_FLAGS = {"log-level", "log-format", "config"}
ROUTER_FLAGS = COMMON_FLAGS | set("""http-host http-port http-threads http-max-connections max-body-bytes max-header-bytes api-key-file allow-unknown-fields
registration workers workers-dns dns-interval-s model block-size max-context tokenizer chat-template
routing-policy routing-temperature uncached-work-weight max-fleet-load decode-s-per-running-request
hot-spot-factor max-queued-requests routing-window-size predicted-ttl-ms heartbeat-timeout-ms
unknown-model-grace-s curve-keypair curve-server-key debug-drop-events request-timeout-s report-timings
cpu-latency-us first-token-timeout-s admission-ttft-s max-waiting-requests pd-split-tokens""".split())
WORKER_FLAGS = COMMON_FLAGS | set("""backend model-dir model-name worker-id requests events replay event-ring-batches http-port router
advertise-host curve-keypair curve-authorized-keys block-size routing-block-size max-num-tokens max-batch-size
max-context tensor-parallel max-queued max-step-ms kv-cache-bytes gpu-memory-fraction kv-cache-dtype
host-cache-bytes offload-min-priority events-include-tokens max-attention-window sink-tokens streaming-llm
attention-chunk-size lora max-loras max-lora-rank shutdown-grace-s mock-step-base-us mock-prefill-token-us
mock-decode-seq-us mock-kv-token-read-us mock-verify-kv mock-workers port-stride cpu-latency-us device role""".split())

# Every metric the issues define (issue 4: event plane; issue 6: worker; issue 7: router).
# A dashboard query naming anything else is a typo or a rename to catch.
KNOWN_METRICS = {
    # issue 7
    "kvfleet_router_requests_total", "kvfleet_router_routing_seconds", "kvfleet_router_matched_blocks",
    "kvfleet_router_cached_tokens_total", "kvfleet_router_time_to_first_token_seconds",
    "kvfleet_router_inter_token_seconds", "kvfleet_router_inflight", "kvfleet_router_retries_total",
    # issue 4
    "kvfleet_router_events_applied_total", "kvfleet_router_event_gaps_total", "kvfleet_router_event_replays_total",
    "kvfleet_router_event_snapshots_total", "kvfleet_router_event_epoch_changes_total",
    "kvfleet_router_event_unknown_parent_total", "kvfleet_router_index_blocks", "kvfleet_router_worker_state",
    "kvfleet_router_event_lag_seconds", "kvfleet_worker_events_published_total",
    "kvfleet_worker_events_dropped_total", "kvfleet_worker_events_replay_requests_total",
    # issue 6
    "kvfleet_worker_kv_blocks", "kvfleet_worker_prefix_hit_tokens_total", "kvfleet_worker_prefix_miss_tokens_total",
    "kvfleet_worker_evictions_total", "kvfleet_worker_offloads_total", "kvfleet_worker_onboards_total",
    "kvfleet_worker_step_seconds", "kvfleet_worker_batch_tokens", "kvfleet_worker_requests",
    "kvfleet_worker_preemptions_total", "kvfleet_worker_time_to_first_token_seconds",
    # issue 19: admission control
    "kvfleet_router_requests_refused_total", "kvfleet_worker_requests_refused_total",
    # issue 18
    "kvfleet_router_event_id_mismatches_total",
    # issue 21: router request metrics, build info (router and worker), worker throughput
    "kvfleet_router_request_duration_seconds", "kvfleet_router_queue_time_seconds",
    "kvfleet_router_prompt_tokens_total", "kvfleet_router_generation_tokens_total",
    "kvfleet_router_unknown_fields_total", "kvfleet_build_info", "kvfleet_worker_generated_tokens_total",
}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")

findings = []


def fail(msg):
    findings.append(msg)


def flags_from_help(binary, fallback):
    if not binary or not os.path.exists(binary):
        return fallback
    out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30).stdout
    flags = set(re.findall(r"--([a-z0-9][a-z0-9-]*)", out))
    return flags or fallback


ROUTER_PREFIX = "KVFLEET_ROUTER_"
WORKER_PREFIX = "KVFLEET_WORKER_"


def env_flag(var, prefix):
    return var[len(prefix):].lower().replace("_", "-")


def check_env_names(where, names, flags, prefix):
    for var in names:
        if not var.startswith("KVFLEET_"):
            continue
        if not var.startswith(prefix):
            fail(f"{where}: {var} lacks the binary's prefix {prefix} (plain KVFLEET_ names are deprecated)")
        elif env_flag(var, prefix) not in flags:
            fail(f"{where}: {var} names no flag --{env_flag(var, prefix)}")


def env_file_vars(path):
    names = []
    for line in open(path):
        line = line.strip()
        if line and not line.startswith("#"):
            names.append(line.split("=", 1)[0])
    return names


def unit_keys(path):
    keys = {}
    for line in open(path):
        line = line.strip()
        if "=" in line and not line.startswith(("#", "[")):
            k, v = line.split("=", 1)
            keys.setdefault(k, []).append(v)
    return keys


def check_systemd(root, router_flags, worker_flags):
    d = os.path.join(root, "deploy/systemd")
    for name, env_files in (("kvfleet-router.service", ["router.env"]),
                            ("kvfleet-worker@.service", ["worker.env", "worker-0.env", "worker-1.env"])):
        keys = unit_keys(os.path.join(d, name))
        for k in ("ExecStart", "EnvironmentFile", "Restart", "KillSignal", "TimeoutStopSec", "User"):
            if k not in keys:
                fail(f"{name}: no {k}=")
        if keys.get("KillSignal") != ["SIGTERM"]:
            fail(f"{name}: KillSignal must be SIGTERM (graceful drain)")
        flags, prefix = (router_flags, ROUTER_PREFIX) if "router" in name else (worker_flags, WORKER_PREFIX)
        for env in env_files:
            check_env_names(env, env_file_vars(os.path.join(d, env)), flags, prefix)
    grace = dict(l.split("=", 1) for l in env_file_vars_lines(os.path.join(d, "worker.env")))
    check_systemd_keys(d)
    stop = int(unit_keys(os.path.join(d, "kvfleet-worker@.service"))["TimeoutStopSec"][0])
    if stop <= float(grace.get("KVFLEET_WORKER_SHUTDOWN_GRACE_S", "30")):
        fail("kvfleet-worker@.service: TimeoutStopSec must exceed KVFLEET_WORKER_SHUTDOWN_GRACE_S")
    analyze = shutil.which("systemd-analyze")
    if not analyze:
        print("systemd-analyze missing: unit syntax not verified")
        return SKIP
    # Verify copies whose binaries and environment files exist, so only the units' own
    # problems are reported; any message at all is a finding (unknown keys only warn).
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(os.path.join(tmp, "bin"))
        for b in ("kvfleet-router", "kvfleet-worker"):
            p = os.path.join(tmp, "bin", b)
            open(p, "w").write("#!/bin/sh\n")
            os.chmod(p, 0o755)
        for env in os.listdir(d):
            if env.endswith(".env"):
                shutil.copy(os.path.join(d, env), tmp)
        units = []
        for name, out in (("kvfleet-router.service", "kvfleet-router.service"),
                          ("kvfleet-worker@.service", "kvfleet-worker@0.service")):
            text = open(os.path.join(d, name)).read()
            text = text.replace("/opt/kvfleet/bin", os.path.join(tmp, "bin")).replace("/etc/kvfleet", tmp)
            open(os.path.join(tmp, out), "w").write(text)
            units.append(os.path.join(tmp, out))
        r = subprocess.run([analyze, "verify", "--man=no"] + units, capture_output=True, text=True)
        msgs = [l for l in (r.stdout + r.stderr).splitlines() if l.strip()]
        if r.returncode != 0 or msgs:
            fail("systemd-analyze verify: " + " | ".join(msgs))
    return 0


def check_systemd_keys(d):
    """The shipped units authenticate membership: the router lists worker keys for its
    registration socket and talks CURVE to workers; every worker registers over CURVE with
    its own key and admits only routers' keys (router/README.md, "Membership")."""
    def env(name):
        return dict(l.split("=", 1) for l in env_file_vars_lines(os.path.join(d, name)))
    router, worker = env("router.env"), env("worker.env")
    for var in ("KVFLEET_ROUTER_REGISTRATION_AUTHORIZED_KEYS", "KVFLEET_ROUTER_CURVE_KEYPAIR",
                "KVFLEET_ROUTER_CURVE_SERVER_KEY"):
        if not router.get(var):
            fail(f"router.env: {var} must be set (registration and worker sockets are authenticated)")
    if "KVFLEET_ROUTER_REGISTRATION_INSECURE" in router:
        fail("router.env: the shipped router must not accept unauthenticated registration")
    for var in ("KVFLEET_WORKER_ROUTER_KEY", "KVFLEET_WORKER_CURVE_KEYPAIR", "KVFLEET_WORKER_CURVE_AUTHORIZED_KEYS"):
        if not worker.get(var):
            fail(f"worker.env: {var} must be set")
    for n in (0, 1):
        if not env(f"worker-{n}.env").get("KVFLEET_WORKER_REGISTRATION_KEYPAIR"):
            fail(f"worker-{n}.env: each worker registers with its own KVFLEET_WORKER_REGISTRATION_KEYPAIR")


def env_file_vars_lines(path):
    return [l.strip() for l in open(path) if l.strip() and not l.strip().startswith("#")]


def dockerfile_instructions(path):
    """(instruction, arguments) with continuation lines joined and comments dropped."""
    out, cur = [], ""
    for line in open(path):
        s = line.rstrip("\n")
        if s.strip().startswith("#") and not cur:
            continue
        if s.strip().startswith("#"):
            continue  # a comment inside a continued RUN
        cur += s.rstrip("\\").strip() + " " if s.endswith("\\") else s.strip()
        if not s.endswith("\\"):
            if cur.strip():
                ins, _, args = cur.strip().partition(" ")
                out.append((ins.upper(), args.strip()))
            cur = ""
    return out


def check_docker(root, router_flags, worker_flags):
    d = os.path.join(root, "deploy/docker")
    for name, flags, ports, runtime in (("router.Dockerfile", router_flags, {"8000"}, "debian:"),
                                        ("worker.Dockerfile", worker_flags, {"5556", "5557", "5558", "9400"},
                                         "nvidia/cuda:")):
        ins = dockerfile_instructions(os.path.join(d, name))
        froms = [a for i, a in ins if i == "FROM"]
        if len(froms) < 2:
            fail(f"{name}: not multi-stage ({len(froms)} FROM)")
            continue
        if not re.search(r"\bAS build$", froms[0], re.I):
            fail(f"{name}: first stage should be 'AS build'")
        if not froms[-1].startswith(runtime):
            fail(f"{name}: runtime base {froms[-1]} should start with {runtime}")
        if name.startswith("worker") and "runtime" not in froms[-1]:
            fail(f"{name}: the worker runs on a CUDA *runtime* image, not {froms[-1]}")
        for f in froms:
            if f.split()[0].endswith(":latest") or ":" not in f.split()[0]:
                fail(f"{name}: unpinned base image {f}")
        last = max(k for k, (i, _) in enumerate(ins) if i == "FROM")
        final = ins[last:]
        users = [a for i, a in final if i == "USER"]
        if not users or users[-1] in ("root", "0"):
            fail(f"{name}: the runtime stage must switch to a non-root USER")
        if not any(i == "COPY" and a.startswith("--from=build") for i, a in final):
            fail(f"{name}: the runtime stage copies nothing from the build stage")
        exposed = set(" ".join(a for i, a in final if i == "EXPOSE").split())
        if not ports <= exposed:
            fail(f"{name}: EXPOSE {sorted(exposed)} lacks {sorted(ports - exposed)}")
        for i, a in ins:
            if i == "RUN" and "apt-get install" in a:
                if "--no-install-recommends" not in a:
                    fail(f"{name}: apt-get install without --no-install-recommends")
                if "rm -rf /var/lib/apt/lists" not in a:
                    fail(f"{name}: apt lists not removed in the same RUN")
            if i == "ADD" and re.search(r"https?://", a):
                fail(f"{name}: ADD of a URL (use RUN with a checksum)")
            if i in ("ENTRYPOINT", "CMD") and not a.startswith("["):
                fail(f"{name}: {i} in shell form (signals would not reach the binary)")
        if not any(i == "HEALTHCHECK" for i, _ in final):
            fail(f"{name}: no HEALTHCHECK")
        if not any(i == "ENTRYPOINT" for i, _ in final):
            fail(f"{name}: no ENTRYPOINT")
        envs = re.findall(r"\b(KVFLEET_[A-Z0-9_]+)=", " ".join(a for i, a in final if i == "ENV"))
        check_env_names(name, envs, flags, ROUTER_PREFIX if name.startswith("router") else WORKER_PREFIX)
    return 0


def load_yaml_docs(path):
    import yaml
    with open(path) as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


def check_k8s(root, router_flags, worker_flags):
    try:
        import yaml  # noqa: F401
    except ImportError:
        print("python3-yaml missing")
        return SKIP
    d = os.path.join(root, "deploy/k8s")
    if shutil.which("yamllint"):
        r = subprocess.run(["yamllint", "-s", "-c", os.path.join(d, ".yamllint"), d], capture_output=True, text=True)
        if r.returncode != 0:
            fail("yamllint: " + r.stdout.strip())
    else:
        print("yamllint missing: YAML style not checked")
    docs = []
    for f in sorted(os.listdir(d)):
        if f.endswith(".yaml") and f != "kustomization.yaml":
            docs += [(f, doc) for doc in load_yaml_docs(os.path.join(d, f))]
    by_kind = {}
    for f, doc in docs:
        for k in ("apiVersion", "kind", "metadata"):
            if k not in doc:
                fail(f"{f}: a document without {k}")
        by_kind.setdefault(doc.get("kind"), []).append(doc)
    kust = load_yaml_docs(os.path.join(d, "kustomization.yaml"))[0]
    listed = set(kust.get("resources", []))
    present = {f for f in os.listdir(d) if f.endswith(".yaml") and f != "kustomization.yaml"}
    if listed != present:
        fail(f"kustomization.yaml resources {sorted(listed)} != files {sorted(present)}")

    def one(kind, name):
        for doc in by_kind.get(kind, []):
            if doc["metadata"]["name"] == name:
                return doc
        fail(f"no {kind} {name}")
        return None

    router = one("Deployment", "kvfleet-router")
    worker = one("StatefulSet", "kvfleet-worker")
    api = one("Service", "kvfleet-router")
    headless = one("Service", "kvfleet-worker")
    monitor = one("ServiceMonitor", "kvfleet")
    if not all((router, worker, api, headless, monitor)):
        return 0
    if router["spec"].get("replicas") != 2:
        fail("router Deployment: replicas must be 2")
    if worker["spec"].get("serviceName") != "kvfleet-worker":
        fail("worker StatefulSet: serviceName must be the headless Service")
    if headless["spec"].get("clusterIP") != "None":
        fail("kvfleet-worker Service must be headless (clusterIP: None)")

    for obj, flags, port_name in ((router, router_flags, "http"), (worker, worker_flags, "metrics")):
        name = obj["metadata"]["name"]
        sel = obj["spec"]["selector"]["matchLabels"]
        labels = obj["spec"]["template"]["metadata"]["labels"]
        if any(labels.get(k) != v for k, v in sel.items()):
            fail(f"{name}: selector {sel} does not match the pod labels {labels}")
        c = obj["spec"]["template"]["spec"]["containers"][0]
        ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
        for probe, path in (("livenessProbe", "/health"), ("readinessProbe", "/ready")):
            p = c.get(probe, {}).get("httpGet", {})
            if p.get("path") != path or p.get("port") not in (port_name, ports.get(port_name)):
                fail(f"{name}: {probe} must GET {path} on port {port_name}, has {p}")
        req = c.get("resources", {}).get("requests", {})
        if "cpu" not in req or "memory" not in req:
            fail(f"{name}: resource requests need cpu and memory, have {req}")
        check_env_names(name, [e["name"] for e in c.get("env", [])], flags,
                        ROUTER_PREFIX if obj is router else WORKER_PREFIX)
        obj["_ports"] = ports
        obj["_labels"] = labels
    check_k8s_keys(router, worker)
    gpu = worker["spec"]["template"]["spec"]["containers"][0]["resources"]
    if str(gpu.get("limits", {}).get("nvidia.com/gpu")) != "1":
        fail("worker: limits must request nvidia.com/gpu: 1")
    workers_dns = {e["name"]: e.get("value") for e in router["spec"]["template"]["spec"]["containers"][0]["env"]}
    dns = workers_dns.get("KVFLEET_ROUTER_WORKERS_DNS", "")
    if not dns.startswith("kvfleet-worker.kvfleet.svc"):
        fail(f"router: KVFLEET_ROUTER_WORKERS_DNS should name the headless Service, is '{dns}'")

    for svc, target in ((api, router), (headless, worker)):
        sname = svc["metadata"]["name"]
        if any(target["_labels"].get(k) != v for k, v in svc["spec"]["selector"].items()):
            fail(f"Service {sname}: selector matches no pod of {target['metadata']['name']}")
        for p in svc["spec"]["ports"]:
            tp = p.get("targetPort", p["port"])
            if isinstance(tp, str) and tp not in target["_ports"]:
                fail(f"Service {sname}: targetPort {tp} is no container port")
    svc_ports = {p["name"] for s in (api, headless) for p in s["spec"]["ports"]}
    mon_sel = monitor["spec"]["selector"]["matchLabels"]
    for s in (api, headless):
        if any(s["metadata"].get("labels", {}).get(k) != v for k, v in mon_sel.items()):
            fail(f"ServiceMonitor does not select Service {s['metadata']['name']}")
    for ep in monitor["spec"]["endpoints"]:
        if ep.get("port") not in svc_ports:
            fail(f"ServiceMonitor endpoint port {ep.get('port')} is no Service port")
        if ep.get("path", "/metrics") != "/metrics":
            fail("ServiceMonitor must scrape /metrics")
    return check_k8s_pd(root, headless, worker_flags)


def check_k8s_pd(root, headless, worker_flags):
    """deploy/k8s-pd (P/D disaggregation) built by kustomize: a decode and a prefill pool, each
    its own pods, both behind the base's headless Service, each with its --role."""
    d = os.path.join(root, "deploy/k8s-pd")
    if shutil.which("yamllint"):
        r = subprocess.run(["yamllint", "-s", "-c", os.path.join(root, "deploy/k8s/.yamllint"), d],
                           capture_output=True, text=True)
        if r.returncode != 0:
            fail("yamllint: " + r.stdout.strip())
    if not shutil.which("kubectl"):
        print("kubectl missing: deploy/k8s-pd not built")
        return SKIP
    r = subprocess.run(["kubectl", "kustomize", d], capture_output=True, text=True)
    if r.returncode != 0:
        fail("kubectl kustomize deploy/k8s-pd: " + r.stderr.strip())
        return 0
    import yaml
    docs = [doc for doc in yaml.safe_load_all(r.stdout) if doc]
    ids = [(doc["kind"], doc["metadata"]["name"]) for doc in docs]
    if len(ids) != len(set(ids)):
        fail(f"deploy/k8s-pd: a resource twice in {ids}")
    pools = {}
    for doc in docs:
        if doc["kind"] != "StatefulSet":
            continue
        name = doc["metadata"]["name"]
        c = doc["spec"]["template"]["spec"]["containers"][0]
        env = [e["name"] for e in c.get("env", [])]
        check_env_names(name, env, worker_flags, WORKER_PREFIX)
        roles = [e.get("value") for e in c.get("env", []) if e["name"] == "KVFLEET_WORKER_ROLE"]
        if len(roles) != 1:
            fail(f"deploy/k8s-pd {name}: KVFLEET_WORKER_ROLE set {len(roles)} times")
            continue
        pools[roles[0]] = doc
        labels = doc["spec"]["template"]["metadata"]["labels"]
        if any(labels.get(k) != v for k, v in headless["spec"]["selector"].items()):
            fail(f"deploy/k8s-pd {name}: the headless Service (the routers' DNS) does not select its pods")
        if doc["spec"].get("serviceName") != "kvfleet-worker":
            fail(f"deploy/k8s-pd {name}: serviceName must be the headless Service")
    if sorted(pools) != ["decode", "prefill"]:
        fail(f"deploy/k8s-pd: wants one decode and one prefill pool, has {sorted(pools)}")
        return 0
    for a, b in (("decode", "prefill"), ("prefill", "decode")):
        sel = pools[a]["spec"]["selector"]["matchLabels"]
        other = pools[b]["spec"]["template"]["metadata"]["labels"]
        if all(other.get(k) == v for k, v in sel.items()):
            fail(f"deploy/k8s-pd: the {a} pool's selector also selects the {b} pool's pods")
    return 0


def check_k8s_keys(router, worker):
    """Workers admit only routers' CURVE keys, both from the Secret kvfleet-curve."""
    wanted = {"kvfleet-router": ("KVFLEET_ROUTER_CURVE_KEYPAIR", "KVFLEET_ROUTER_CURVE_SERVER_KEY"),
              "kvfleet-worker": ("KVFLEET_WORKER_CURVE_KEYPAIR", "KVFLEET_WORKER_CURVE_AUTHORIZED_KEYS")}
    for obj in (router, worker):
        name = obj["metadata"]["name"]
        pod = obj["spec"]["template"]["spec"]
        c = pod["containers"][0]
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        for var in wanted[name]:
            if not env.get(var):
                fail(f"{name}: {var} must be set (CURVE between routers and workers)")
        secrets = {v["name"] for v in pod.get("volumes", []) if v.get("secret", {}).get("secretName") == "kvfleet-curve"}
        mounts = {m["name"] for m in c.get("volumeMounts", [])}
        if not secrets & mounts:
            fail(f"{name}: must mount the Secret kvfleet-curve")
        if "fsGroup" not in pod.get("securityContext", {}):
            fail(f"{name}: needs an fsGroup to read its keys as a non-root user")


def check_prometheus(root):
    path = os.path.join(root, "deploy/prometheus/prometheus.yml")
    promtool = shutil.which("promtool")
    if promtool:
        r = subprocess.run([promtool, "check", "config", path], capture_output=True, text=True)
        if r.returncode != 0:
            fail("promtool: " + (r.stdout + r.stderr).strip())
    else:
        print("promtool missing: config syntax not checked")
    import yaml
    cfg = yaml.safe_load(open(path))
    targets = {t for job in cfg["scrape_configs"] for sc in job.get("static_configs", []) for t in sc["targets"]}
    for t in ("127.0.0.1:8000", "127.0.0.1:9400"):
        if t not in targets:
            fail(f"prometheus.yml does not scrape {t}")
    return 0


def metric_names(expr):
    names = set(re.findall(r"\bkvfleet_[a-z0-9_]+", expr))
    out = set()
    for n in names:
        for s in HISTOGRAM_SUFFIXES:
            if n.endswith(s) and n[: -len(s)] in KNOWN_METRICS:
                n = n[: -len(s)]
        out.add(n)
    return out


def check_grafana(root):
    dash = json.load(open(os.path.join(root, "deploy/grafana/kvfleet.json")))
    used = set()
    ids = set()
    for p in dash["panels"]:
        if p["id"] in ids:
            fail(f"duplicate panel id {p['id']}")
        ids.add(p["id"])
        for t in p.get("targets", []):
            names = metric_names(t["expr"])
            if not names:
                fail(f"panel '{p['title']}': a query with no kvfleet metric: {t['expr']}")
            for n in names - KNOWN_METRICS:
                fail(f"panel '{p['title']}': {n} is in no issue's metric list")
            used |= names
    # What issue 9 asks the dashboard to show.
    required = {
        "hit rate": "kvfleet_worker_prefix_hit_tokens_total",
        "TTFT": "kvfleet_router_time_to_first_token_seconds",
        "requests by worker": "kvfleet_router_requests_total",
        "index size": "kvfleet_router_index_blocks",
        "event lag": "kvfleet_router_event_lag_seconds",
        "gaps": "kvfleet_router_event_gaps_total",
        "replays": "kvfleet_router_event_replays_total",
        "KV usage per tier": "kvfleet_worker_kv_blocks",
        "evictions": "kvfleet_worker_evictions_total",
        "preemptions": "kvfleet_worker_preemptions_total",
        # issue 21
        "request duration": "kvfleet_router_request_duration_seconds",
        "queue time": "kvfleet_router_queue_time_seconds",
        "prompt tokens": "kvfleet_router_prompt_tokens_total",
        "generated tokens": "kvfleet_router_generation_tokens_total",
        "throughput": "kvfleet_worker_generated_tokens_total",
        "build versions": "kvfleet_build_info",
    }
    for what, metric in required.items():
        if metric not in used:
            fail(f"the dashboard does not show {what} ({metric})")
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p.get("targets", []))
    for q in ("0.5", "0.99"):
        if f"histogram_quantile({q}, sum by (le) (rate(kvfleet_router_time_to_first_token_seconds_bucket" not in exprs:
            fail(f"the dashboard lacks router TTFT quantile {q}")
    if "sum by (worker) (rate(kvfleet_router_requests_total" not in exprs:
        fail("the dashboard lacks requests by worker")
    return 0


def main(argv):
    root, what = argv[1], argv[2]
    opts = dict(zip(argv[3::2], argv[4::2]))
    router_flags = flags_from_help(opts.get("--router-bin"), ROUTER_FLAGS)
    worker_flags = flags_from_help(opts.get("--worker-bin"), WORKER_FLAGS)
    checks = {
        "systemd": lambda: check_systemd(root, router_flags, worker_flags),
        "docker": lambda: check_docker(root, router_flags, worker_flags),
        "k8s": lambda: check_k8s(root, router_flags, worker_flags),
        "prometheus": lambda: check_prometheus(root),
        "grafana": lambda: check_grafana(root),
    }
    rc = checks[what]()
    for f in findings:
        print("FAIL:", f)
    if findings:
        return 1
    print(f"{what}: ok" + (" (partly skipped)" if rc == SKIP else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
