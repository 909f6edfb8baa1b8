// The admin part of the gRPC codec (grpc_codec.h): metadata, model config, statistics, the repository index,
// load requests and shared memory registration, with the content of codec_admin.cpp's JSON answers. Keys the
// protobuf schema has no field for (the config's run_inline_when_idle, seq_bucket_promotion and graph_batch_sizes, per-instance
// statistics) are over HTTP only.
#include "grpc_codec.h"

#include "codec.h"

namespace aotc::server::grpc_codec {
namespace {

inference::DataType data_type(WireType t) {
  inference::DataType d = inference::TYPE_INVALID;
  inference::DataType_Parse(triton_type_name(t), &d);
  return t == WireType::BYTES ? inference::TYPE_STRING : d;
}

void put(const Duration& d, inference::StatisticDuration* out) {
  out->set_count(d.count);
  out->set_ns(d.ns);
}

template <typename Tensors>
void put_config_tensors(const std::vector<TensorInfo>& ts, bool drop_batch_dim, Tensors* out) {
  for (const auto& t : ts) {
    auto* m = out->Add();
    m->set_name(t.name);
    m->set_data_type(data_type(t.type));
    for (size_t i = drop_batch_dim ? 1 : 0; i < t.shape.size(); ++i) m->add_dims(t.shape[i]);
  }
}

}  // namespace

void write_server_metadata(const ServerInfo& info, inference::ServerMetadataResponse& out) {
  out.set_name(info.name);
  out.set_version(info.version);
  for (const auto& e : info.extensions) out.add_extensions(e);
}

void write_model_metadata(const ModelInfo& info, const std::vector<std::string>& versions,
                          inference::ModelMetadataResponse& out) {
  out.set_name(info.name);
  for (const auto& v : versions) out.add_versions(v);
  out.set_platform("torch_aoti");
  for (auto [ts, dst] : {std::pair{&info.inputs, out.mutable_inputs()}, std::pair{&info.outputs, out.mutable_outputs()}})
    for (const auto& t : *ts) {
      auto* m = dst->Add();
      m->set_name(t.name);
      m->set_datatype(wire_type_name(t.type));
      for (int64_t d : t.shape) m->add_shape(d);
    }
}

void write_model_config(const ModelInfo& info, const ModelConfig& c, inference::ModelConfig& out) {
  const bool batching = c.max_batch_size > 0;
  out.set_name(info.name);
  out.set_platform("torch_aoti");
  out.set_backend("aotc");
  out.set_max_batch_size(static_cast<int32_t>(batching ? c.max_batch_size : 0));
  put_config_tensors(info.inputs, batching, out.mutable_input());
  put_config_tensors(info.outputs, batching, out.mutable_output());
  if (batching) {
    auto* db = out.mutable_dynamic_batching();
    for (int64_t b : c.preferred_batch_sizes) db->add_preferred_batch_size(static_cast<int32_t>(b));
    db->set_max_queue_delay_microseconds(static_cast<uint64_t>(c.max_queue_delay_us));
    db->mutable_default_queue_policy()->set_max_queue_size(static_cast<uint32_t>(c.max_queue_size));
  }
  if (c.model_warmup)
    for (const auto& s : *c.model_warmup) {
      auto* w = out.add_model_warmup();
      w->set_name(s.name);
      w->set_batch_size(static_cast<uint32_t>(s.batch_size));
      w->set_count(static_cast<uint32_t>(s.count));
      for (const auto& [name, in] : s.inputs) {
        inference::ModelWarmup::Input& i = (*w->mutable_inputs())[name];
        inference::DataType d = inference::TYPE_INVALID;
        inference::DataType_Parse(in.data_type, &d);
        i.set_data_type(d);
        for (int64_t dim : in.dims) i.add_dims(dim);
        if (in.source == "zero_data") i.set_zero_data(true);
        else if (in.source == "random_data") i.set_random_data(true);
        else i.set_input_data_file(in.file);
      }
    }
  for (const auto& g : effective_instance_groups(info, c)) {
    auto* m = out.add_instance_group();
    m->set_count(static_cast<int32_t>(g.count));
    m->set_kind(g.kind == "KIND_GPU" ? inference::ModelInstanceGroup::KIND_GPU : inference::ModelInstanceGroup::KIND_CPU);
    for (int64_t i : g.gpus) m->add_gpus(static_cast<int32_t>(i));
  }
  if (info.device == "cuda") out.mutable_optimization()->mutable_cuda()->set_graphs(!info.graph_buckets.empty());
}

void write_stats(const std::vector<ModelStats>& stats, inference::ModelStatisticsResponse& out) {
  for (const auto& s : stats) {
    auto* m = out.add_model_stats();
    m->set_name(s.name);
    m->set_version(s.version);
    m->set_last_inference(s.last_inference_ms);
    m->set_inference_count(s.inference_count);
    m->set_execution_count(s.execution_count);
    auto* i = m->mutable_inference_stats();
    put(s.success, i->mutable_success());
    put(s.fail, i->mutable_fail());
    put(s.queue, i->mutable_queue());
    put(s.compute_input, i->mutable_compute_input());
    put(s.compute_infer, i->mutable_compute_infer());
    put(s.compute_output, i->mutable_compute_output());
    put(Duration{}, i->mutable_cache_hit());
    put(Duration{}, i->mutable_cache_miss());
    for (const auto& [size, b] : s.batch_stats) {
      auto* bs = m->add_batch_stats();
      bs->set_batch_size(static_cast<uint64_t>(size));
      put(b.compute_input, bs->mutable_compute_input());
      put(b.compute_infer, bs->mutable_compute_infer());
      put(b.compute_output, bs->mutable_compute_output());
    }
  }
}

void write_repository_index(const std::vector<VersionState>& states, inference::RepositoryIndexResponse& out) {
  for (const auto& s : states) {
    auto* m = out.add_models();
    m->set_name(s.name);
    m->set_version(s.version);
    m->set_state(s.state);
    m->set_reason(s.reason);
  }
}

std::optional<std::string> parse_load_request(const inference::RepositoryModelLoadRequest& message) {
  std::optional<std::string> config;
  for (const auto& [key, value] : message.parameters()) {
    const bool is_string = value.parameter_choice_case() == inference::ModelRepositoryParameter::kStringParam;
    codec::check_load_parameter(key, is_string);
    config = value.string_param();
  }
  return config;
}

SharedMemoryRegion parse_shm_register(const inference::SystemSharedMemoryRegisterRequest& m) {
  if (m.key().empty())
    throw bad_request("registration of shared memory region '" + m.name() + "': missing string field 'key'");
  return SharedMemoryRegion{m.name(), m.key(), m.offset(), m.byte_size()};
}

void write_shm_status(const std::vector<SharedMemoryRegion>& regions, inference::SystemSharedMemoryStatusResponse& out) {
  for (const auto& r : regions) {
    auto& s = (*out.mutable_regions())[r.name];
    s.set_name(r.name);
    s.set_key(r.key);
    s.set_offset(r.offset);
    s.set_byte_size(r.byte_size);
  }
}

CudaSharedMemoryRegion parse_cuda_shm_register(const inference::CudaSharedMemoryRegisterRequest& m) {
  const std::string where = "registration of CUDA shared memory region '" + m.name() + "'";
  if (m.raw_handle().empty()) throw bad_request(where + ": missing 'raw_handle' (the bytes of a cudaIpcMemHandle_t)");
  if (m.device_id() < 0) throw bad_request(where + ": 'device_id' must not be negative");
  CudaSharedMemoryRegion r;
  r.name = m.name();
  r.raw_handle = m.raw_handle();
  r.device_id = m.device_id();
  r.byte_size = m.byte_size();
  return r;
}

void write_cuda_shm_status(const std::vector<CudaSharedMemoryRegion>& regions,
                           inference::CudaSharedMemoryStatusResponse& out) {
  for (const auto& r : regions) {
    auto& s = (*out.mutable_regions())[r.name];
    s.set_name(r.name);
    s.set_device_id(static_cast<uint64_t>(r.device_id));
    s.set_byte_size(r.byte_size);
  }
}

}  // namespace aotc::server::grpc_codec
