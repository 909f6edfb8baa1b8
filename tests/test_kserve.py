"""deploy/kserve/: the manifests against KServe's own CRD schemas (tests/data/kserve/: KServe v0.20's
config/crd/full/), and the serving runtime's command line against aotc-server's flags, so neither can drift
from what KServe and the server accept. No cluster: schema checks with jsonschema."""

from __future__ import annotations

import re
import subprocess
import time
import urllib.request
from pathlib import Path

import jsonschema
import pytest
import yaml

from conftest import REPO
from launch import free_port, server_binary

DEPLOY = REPO / "deploy" / "kserve"
CRDS = REPO / "tests" / "data" / "kserve"


def crd_schema(kind: str, version: str) -> dict:
    for path in CRDS.glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["kind"] == kind:
            return next(v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"] if v["name"] == version)
    raise AssertionError(f"no CRD of kind {kind} in {CRDS}")


def manifests() -> list[Path]:
    return sorted(DEPLOY.glob("*.yaml"))


@pytest.mark.parametrize("path", manifests(), ids=lambda p: p.name)
def test_manifest_validates_against_its_crd(path):
    doc = yaml.safe_load(path.read_text())
    group, _, version = doc["apiVersion"].partition("/")
    assert group == "serving.kserve.io"
    jsonschema.validate(doc, crd_schema(doc["kind"], version))


def test_the_schema_check_can_fail():
    doc = yaml.safe_load((DEPLOY / "cluster-serving-runtime.yaml").read_text())
    doc["spec"]["containers"][0]["securityContext"]["runAsUser"] = "root"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, crd_schema("ClusterServingRuntime", "v1alpha1"))


def test_the_runtime_serves_v2_as_a_non_root_user_with_probes():
    spec = yaml.safe_load((DEPLOY / "cluster-serving-runtime.yaml").read_text())["spec"]
    assert "v2" in spec["protocolVersions"] and spec["supportedModelFormats"][0]["name"] == "aotc"
    assert spec["annotations"]["prometheus.kserve.io/path"] == "/metrics"
    (c,) = spec["containers"]
    assert c["name"] == "kserve-container"
    assert c["securityContext"]["runAsNonRoot"] and c["securityContext"]["runAsUser"] == 1000
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert "--model-repository=/mnt/models" in c["args"] and "--http-port=8080" in c["args"]
    assert "grpc-v2" in spec["protocolVersions"] and "--grpc-port=9000" in c["args"]
    assert {p["containerPort"] for p in c["ports"]} == {8080, 9000}


def test_the_runtime_args_serve_a_lone_package_over_http_and_grpc(tmp_path, pkg_simple):
    """The runtime's own args, with /mnt/models holding one model.pt2 (what a storageUri of a single file
    leaves) and the ports moved to free ones: the InferenceService's name serves over both protocols."""
    grpc = pytest.importorskip("tritonclient.grpc")
    c = yaml.safe_load((DEPLOY / "cluster-serving-runtime.yaml").read_text())["spec"]["containers"][0]
    mnt = tmp_path / "mnt" / "models"
    mnt.mkdir(parents=True)
    (mnt / "model.pt2").symlink_to(pkg_simple)
    http_port = free_port()
    grpc_port = free_port(http_port)
    subst = {"/mnt/models": str(mnt), "{{.Name}}": "mlp-isvc", "0.0.0.0": "127.0.0.1",
             "8080": str(http_port), "9000": str(grpc_port)}
    args = [re.sub("|".join(re.escape(k) for k in subst), lambda m: subst[m.group(0)], a) for a in c["args"]]
    proc = subprocess.Popen([str(server_binary()), *args], stderr=subprocess.PIPE, text=True)
    try:
        client = grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        deadline = time.monotonic() + 60
        while True:
            try:
                if client.is_server_ready(client_timeout=2):
                    break
            except grpc.InferenceServerException:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "the runtime's args did not serve"
            time.sleep(0.1)
        assert client.get_model_metadata("mlp-isvc", client_timeout=10).name == "mlp-isvc"
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/models/mlp-isvc/ready", timeout=10) as r:
            assert r.status == 200
    finally:
        proc.terminate()
        assert proc.wait(30) == 0, proc.stderr.read()


def test_every_flag_the_runtime_passes_is_an_aotc_server_flag():
    c = yaml.safe_load((DEPLOY / "cluster-serving-runtime.yaml").read_text())["spec"]["containers"][0]
    assert c["command"] == ["/opt/aotc/bin/aotc-server"]
    known = set(re.findall(r"^\s+(--[a-z-]+)", subprocess.run([str(server_binary()), "--help"], capture_output=True,
                                                               text=True, timeout=30).stdout, re.M))
    given = {a.split("=", 1)[0] for a in c["args"] if a.startswith("--")}
    assert given <= known, given - known


def test_the_inference_service_names_the_runtime_and_its_format():
    isvc = yaml.safe_load((DEPLOY / "inference-service.yaml").read_text())
    rt = yaml.safe_load((DEPLOY / "cluster-serving-runtime.yaml").read_text())
    model = isvc["spec"]["predictor"]["model"]
    assert model["runtime"] == rt["metadata"]["name"]
    assert model["modelFormat"]["name"] in {f["name"] for f in rt["spec"]["supportedModelFormats"]}
    assert model["protocolVersion"] in rt["spec"]["protocolVersions"]
