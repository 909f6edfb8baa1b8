"""aotc-server's gRPC contract, runtime_cpp/server/proto/{grpc_service,model_config}.proto, is tritonclient's:
the files compiled by the system's protoc into a FileDescriptorSet and compared with the descriptors that
tritonclient's generated modules carry (tritonclient.grpc.service_pb2, model_config_pb2), field by field:
every message, nested ones too (field name, number, type, label, type_name, oneof, proto3 optional, map
entry), every enum value, every RPC (input and output types, streaming both ways). A mutated copy of the
compiled set must be reported as different, so the comparison itself is checked.

Not a test of the server (tests/test_protocol_grpc.py talks to it); needs protoc, imports no aotc code.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PROTO_DIR = REPO / "runtime_cpp" / "server" / "proto"
descriptor_pb2 = pytest.importorskip("google.protobuf.descriptor_pb2")
grpc_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")
config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict:
    """{file name: FileDescriptorProto} of our .proto files, as protoc compiles them."""
    protoc = shutil.which("protoc")
    if protoc is None:
        pytest.skip("no protoc on PATH (apt-get install protobuf-compiler)")
    out = tmp_path_factory.mktemp("proto") / "set.pb"
    r = subprocess.run([protoc, f"--descriptor_set_out={out}", "--include_imports", "-I", str(PROTO_DIR),
                        "grpc_service.proto"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    return {f.name: f for f in fds.file}


def tritonclients() -> dict:
    """{file name: FileDescriptorProto} of tritonclient's generated modules, from the bytes protoc embedded."""
    return {m.DESCRIPTOR.name: descriptor_pb2.FileDescriptorProto.FromString(m.DESCRIPTOR.serialized_pb)
            for m in (grpc_pb2, config_pb2)}


def shape(fdp) -> dict:
    """Everything of one file that goes on the wire or names a type, flattened: {(kind, full name): facts}."""
    out = {("file", fdp.name): (fdp.package, fdp.syntax or "proto2", tuple(fdp.dependency))}

    def enum(prefix: str, e) -> None:
        out[("enum", f"{prefix}.{e.name}")] = tuple((v.name, v.number) for v in e.value)

    def message(prefix: str, m) -> None:
        name = f"{prefix}.{m.name}"
        out[("message", name)] = (bool(m.options.map_entry), tuple(o.name for o in m.oneof_decl))
        for f in m.field:
            oneof = m.oneof_decl[f.oneof_index].name if f.HasField("oneof_index") else None
            out[("field", f"{name}.{f.name}")] = (f.number, descriptor_pb2.FieldDescriptorProto.Type.Name(f.type),
                                                  descriptor_pb2.FieldDescriptorProto.Label.Name(f.label),
                                                  f.type_name, oneof, f.proto3_optional)
        for e in m.enum_type:
            enum(name, e)
        for n in m.nested_type:
            message(name, n)

    package = "." + fdp.package
    for e in fdp.enum_type:
        enum(package, e)
    for m in fdp.message_type:
        message(package, m)
    for s in fdp.service:
        for r in s.method:
            out[("rpc", f"{package}.{s.name}.{r.name}")] = (r.input_type, r.output_type, r.client_streaming,
                                                            r.server_streaming)
    return out


def differences(ours, theirs) -> list[str]:
    """One line per item that one side lacks or that differs; [] when the two files describe the same wire."""
    a, b = shape(ours), shape(theirs)
    lines = [f"only in {ours.name}: {k[0]} {k[1]} {a[k]}" for k in sorted(a.keys() - b.keys())]
    lines += [f"only in tritonclient: {k[0]} {k[1]} {b[k]}" for k in sorted(b.keys() - a.keys())]
    lines += [f"{k[0]} {k[1]}: ours {a[k]}, tritonclient {b[k]}" for k in sorted(a.keys() & b.keys()) if a[k] != b[k]]
    return lines


def test_both_files_are_compiled_and_named_as_tritonclients(compiled):
    assert set(compiled) == {"grpc_service.proto", "model_config.proto"} == set(tritonclients())


@pytest.mark.parametrize("name", ["grpc_service.proto", "model_config.proto"])
def test_same_wire_as_tritonclient(compiled, name):
    ours, theirs = compiled[name], tritonclients()[name]
    assert differences(ours, theirs) == []
    # the walk saw the whole file: as many messages (nested ones included) and fields as tritonclient's
    kinds = [k[0] for k in shape(theirs)]
    assert kinds.count("message") > 20 and kinds.count("field") > 60


def test_the_service_has_tritons_rpcs(compiled):
    rpcs = {k[1].rsplit(".", 1)[1]: v for k, v in shape(compiled["grpc_service.proto"]).items() if k[0] == "rpc"}
    assert len(rpcs) == len(grpc_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods)
    assert rpcs["ModelInfer"] == (".inference.ModelInferRequest", ".inference.ModelInferResponse", False, False)
    assert rpcs["ModelStreamInfer"] == (".inference.ModelInferRequest", ".inference.ModelStreamInferResponse",
                                        True, True)


def _first(items, pred):
    return next(x for x in items if pred(x))


def _mutations():
    """(what, function that breaks a copy of grpc_service.proto's FileDescriptorProto in place)."""
    def msg(f, name):
        return _first(f.message_type, lambda m: m.name == name)

    def field(f, m, name):
        return _first(msg(f, m).field, lambda x: x.name == name)

    def renumber(f):
        field(f, "ModelInferRequest", "raw_input_contents").number = 99

    def retype(f):
        field(f, "ModelInferRequest", "id").type = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES

    def relabel(f):
        field(f, "ModelInferRequest", "id").label = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED

    def rename_type(f):
        field(f, "ModelInferResponse", "outputs").type_name = ".inference.ModelInferRequest.InferInputTensor"

    def leave_oneof(f):
        m = _first(f.message_type, lambda m: any(x.HasField("oneof_index") for x in m.field))
        _first(m.field, lambda x: x.HasField("oneof_index")).ClearField("oneof_index")

    def drop_nested(f):
        m = _first(f.message_type, lambda m: any(not n.options.map_entry for n in m.nested_type))
        n = _first(m.nested_type, lambda n: not n.options.map_entry)
        m.nested_type.remove(n)

    def unmap(f):
        m = _first(f.message_type, lambda m: any(n.options.map_entry for n in m.nested_type))
        _first(m.nested_type, lambda n: n.options.map_entry).options.map_entry = False

    def no_stream(f):
        _first(f.service[0].method, lambda r: r.name == "ModelStreamInfer").server_streaming = False

    def swap_output(f):
        _first(f.service[0].method, lambda r: r.name == "ModelInfer").output_type = ".inference.ModelInferRequest"

    def drop_rpc(f):
        del f.service[0].method[-1]

    def extra_field(f):
        msg(f, "ServerLiveResponse").field.add(name="extra", number=2, type=8, label=1)

    return [(fn.__name__, fn) for fn in (renumber, retype, relabel, rename_type, leave_oneof, drop_nested, unmap,
                                         no_stream, swap_output, drop_rpc, extra_field)]


@pytest.mark.parametrize("what, mutate", _mutations())
def test_a_mutated_copy_is_reported(compiled, what, mutate):
    broken = copy.deepcopy(compiled["grpc_service.proto"])
    mutate(broken)
    found = differences(broken, tritonclients()["grpc_service.proto"])
    assert found, f"{what}: the comparison did not notice"


def test_a_mutated_enum_value_is_reported(compiled):
    broken = copy.deepcopy(compiled["model_config.proto"])
    e = _first(broken.enum_type, lambda e: e.name == "DataType")
    e.value[1].number = 77
    found = differences(broken, tritonclients()["model_config.proto"])
    assert found == [f"enum .inference.DataType: ours {shape(broken)[('enum', '.inference.DataType')]}, "
                     f"tritonclient {shape(tritonclients()['model_config.proto'])[('enum', '.inference.DataType')]}"]
