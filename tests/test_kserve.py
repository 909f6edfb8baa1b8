"""deploy/kserve/: the manifests against KServe's own CRD schemas (tests/data/kserve/: KServe v0.20's
config/crd/full/), and the serving runtime's command line against aotc-server's flags, so neither can drift
from what KServe and the server accept. No cluster: schema checks with jsonschema."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from conftest import REPO
from launch import server_binary

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
