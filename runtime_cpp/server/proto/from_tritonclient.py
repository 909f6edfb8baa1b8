"""Writes grpc_service.proto and model_config.proto, the KServe v2 / Triton gRPC wire contract, from the
descriptors that tritonclient's generated modules carry (tritonclient.grpc.service_pb2, model_config_pb2):
same package, message, field, enum and RPC names and numbers. Run it again when tritonclient's contract grows;
tests/test_grpc_proto.py checks the committed files against tritonclient field by field.

    python runtime_cpp/server/proto/from_tritonclient.py runtime_cpp/server/proto
"""

from __future__ import annotations

import sys
from pathlib import Path

from google.protobuf import descriptor as d

SCALAR = {
    d.FieldDescriptor.TYPE_DOUBLE: "double", d.FieldDescriptor.TYPE_FLOAT: "float",
    d.FieldDescriptor.TYPE_INT64: "int64", d.FieldDescriptor.TYPE_UINT64: "uint64",
    d.FieldDescriptor.TYPE_INT32: "int32", d.FieldDescriptor.TYPE_FIXED64: "fixed64",
    d.FieldDescriptor.TYPE_FIXED32: "fixed32", d.FieldDescriptor.TYPE_BOOL: "bool",
    d.FieldDescriptor.TYPE_STRING: "string", d.FieldDescriptor.TYPE_BYTES: "bytes",
    d.FieldDescriptor.TYPE_UINT32: "uint32", d.FieldDescriptor.TYPE_SFIXED32: "sfixed32",
    d.FieldDescriptor.TYPE_SFIXED64: "sfixed64", d.FieldDescriptor.TYPE_SINT32: "sint32",
    d.FieldDescriptor.TYPE_SINT64: "sint64",
}


def type_name(f: d.FieldDescriptor) -> str:
    if f.message_type is not None:
        return "." + f.message_type.full_name
    if f.enum_type is not None:
        return "." + f.enum_type.full_name
    return SCALAR[f.type]


def is_repeated(f: d.FieldDescriptor) -> bool:
    return f.is_repeated if hasattr(f, "is_repeated") else f.label == d.FieldDescriptor.LABEL_REPEATED


def field_line(f: d.FieldDescriptor) -> str:
    m = f.message_type
    if m is not None and m.GetOptions().map_entry:
        k, v = m.fields_by_name["key"], m.fields_by_name["value"]
        return f"map<{type_name(k)}, {type_name(v)}> {f.name} = {f.number};"
    return f"{'repeated ' if is_repeated(f) else ''}{type_name(f)} {f.name} = {f.number};"


def enum_lines(e: d.EnumDescriptor, pad: str) -> list[str]:
    out = [f"{pad}enum {e.name} {{"]
    out += [f"{pad}  {v.name} = {v.number};" for v in e.values]
    return out + [f"{pad}}}"]


def message_lines(m: d.Descriptor, pad: str) -> list[str]:
    out = [f"{pad}message {m.name} {{"]
    for e in m.enum_types:
        out += enum_lines(e, pad + "  ")
    for n in m.nested_types:
        if not n.GetOptions().map_entry:
            out += message_lines(n, pad + "  ")
    done = set()
    for f in m.fields:
        o = f.containing_oneof
        if o is None:
            out.append(f"{pad}  {field_line(f)}")
        elif o.name not in done:
            done.add(o.name)
            out.append(f"{pad}  oneof {o.name} {{")
            out += [f"{pad}    {field_line(g)}" for g in o.fields]
            out.append(f"{pad}  }}")
    return out + [f"{pad}}}"]


def proto_text(fd: d.FileDescriptor) -> str:
    out = [
        f"// {fd.name}: written by from_tritonclient.py from tritonclient's descriptors; do not edit by hand.",
        'syntax = "proto3";', "", f"package {fd.package};", "",
    ]
    out += [f'import "{dep.name}";' for dep in fd.dependencies]
    if fd.dependencies:
        out.append("")
    for s in fd.services_by_name.values():
        out.append(f"service {s.name} {{")
        for m in s.methods:
            cs = "stream " if m.client_streaming else ""
            ss = "stream " if m.server_streaming else ""
            out.append(f"  rpc {m.name}({cs}.{m.input_type.full_name}) returns ({ss}.{m.output_type.full_name}) {{}}")
        out += ["}", ""]
    for e in fd.enum_types_by_name.values():
        out += enum_lines(e, "") + [""]
    for m in fd.message_types_by_name.values():
        out += message_lines(m, "") + [""]
    return "\n".join(out)


def main(out_dir: str) -> None:
    from tritonclient.grpc import model_config_pb2, service_pb2

    for module in (model_config_pb2, service_pb2):
        fd = module.DESCRIPTOR
        Path(out_dir, fd.name).write_text(proto_text(fd))
        print(Path(out_dir, fd.name))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).parent))
