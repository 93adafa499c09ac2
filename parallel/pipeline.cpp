// The pipeline executor: a stage's actions over the pp group.
#include "parallel/pipeline.h"

#include <algorithm>

#include "core/error.h"
#include "core/sizes.h"

namespace moe {

int64_t pipeline_slots(PipeSchedule schedule, int64_t stages, int64_t stage, int64_t micro_batches, int64_t chunks,
                       int64_t chunk) {
  int64_t in_flight = 0, most = 0;
  for (const PipeAction& a : pipeline_actions(schedule, stages, stage, micro_batches, chunks)) {
    if (a.chunk != chunk) continue;
    in_flight += a.op == PipeOp::Forward ? 1 : a.op == PipeOp::Backward ? -1 : 0;
    most = std::max(most, in_flight);
  }
  return most;
}

template <typename T>
struct PipelineExecutor<T>::Slot {
  Buffer received;                      // the activation (or its gradient) from a neighbour
  Buffer activation_out, gradient_out;  // what this slot sends, kept until the send completes
  std::unique_ptr<Request> activation_sent, gradient_sent;
};

template <typename T>
PipelineExecutor<T>::PipelineExecutor(Model<T>& stage, Communicator& pp, PipeSchedule schedule, int64_t micro_batches,
                                      int64_t batch, int64_t seq_len)
    : PipelineExecutor(std::vector<Model<T>*>{&stage}, pp, schedule, micro_batches, batch, seq_len) {}

template <typename T>
PipelineExecutor<T>::PipelineExecutor(const std::vector<Model<T>*>& chunks, Communicator& pp, PipeSchedule schedule,
                                      int64_t micro_batches, int64_t batch, int64_t seq_len)
    : chunks_(chunks),
      pp_(pp),
      stage_(pp.rank()),
      stages_(pp.size()),
      batch_(batch),
      seq_len_(seq_len),
      rows_(chunks.at(0)->rows(batch * seq_len) * chunks.at(0)->shape().d_model),
      actions_(pipeline_actions(schedule, pp.size(), pp.rank(), micro_batches, int64_t(chunks.size()))) {
  const int64_t V = int64_t(chunks.size()), last_virtual = stages_ * V - 1;
  slots_.resize(size_t(V));
  for (int64_t c = 0; c < V; ++c) {
    const Model<T>& model = *chunks_[size_t(c)];
    const int64_t slots = pipeline_slots(schedule, stages_, stage_, micro_batches, V, c);
    const int64_t v = virtual_stage(stages_, stage_, c);
    MOE_CHECK(model.num_slots() >= slots, "pipeline stage " << stage_ << " chunk " << c << " keeps " << slots
                                                            << " micro-batches in flight; its model has "
                                                            << model.num_slots() << " slots");
    MOE_CHECK(model.stage().embedding == (v == 0) && model.stage().head == (v == last_virtual),
              "pipeline stage " << stage_ << " chunk " << c << " (virtual stage " << v << " of " << last_virtual + 1
                                << "): the embedding belongs to the first virtual stage and the head to the last");
    MOE_CHECK(model.rows(batch * seq_len) * model.shape().d_model == rows_,
              "pipeline chunks of one stage pass activations of one size");
    slots_[size_t(c)].resize(size_t(slots));
    Backend& backend = chunks_[size_t(c)]->backend();
    const sizes::PipelineSlot size =
        sizes::pipeline_slot(double(model.rows(batch * seq_len)), double(model.shape().d_model));
    for (Slot& s : slots_[size_t(c)]) {
      s.received = backend.allocate(dtype_of<T>(), sizes::elements(size.received));
      s.activation_out = backend.allocate(dtype_of<T>(), sizes::elements(size.activation_out));
      s.gradient_out = backend.allocate(dtype_of<T>(), sizes::elements(size.gradient_out));
    }
  }
  tokens_.assign(size_t(batch * (seq_len + 1)), 0);
}

template <typename T>
PipelineExecutor<T>::~PipelineExecutor() = default;

// Waits for the slot's previous send of this kind, then sends a copy of `data`. The host does not wait for the
// copy: the data plane takes the buffer after the backend's work queued before the send (communicator.h), NCCL on
// its stream after the compute stream's, so the send is ordered after the copy on the device.
template <typename T>
void PipelineExecutor<T>::send(Slot& slot, std::unique_ptr<Request>& request, Buffer& buffer, const T* data, int peer,
                               int tag) {
  if (request) request->wait();
  Backend& backend = chunks_[0]->backend();
  backend.copy(buffer.template data<T>(), data, size_t(rows_) * sizeof(T));
  request = pp_.isend(buffer.template data<T>(), rows_, peer, tag);
}

// A send followed by a receive goes out with it: NCCL's communicator (parallel/nccl_communicator.h) holds
// sends until a request is tested or waited for and then issues the held transfers as one group, the send
// and receive pair Megatron-Core batches so that neighbours that both send first do not wait for each other.
// A send with compute after it is tested at once, so that it travels during that compute.
template <typename T>
bool PipelineExecutor<T>::receives_next(size_t i) const {
  if (i + 1 >= actions_.size()) return false;
  const PipeOp next = actions_[i + 1].op;
  return next == PipeOp::RecvActivation || next == PipeOp::RecvGradient;
}

template <typename T>
int PipelineExecutor<T>::peer(int64_t chunk, int64_t step) const {
  return int((virtual_stage(stages_, stage_, chunk) + step) % stages_);
}

// With one chunk: 2 mb for activations, 2 mb + 1 for gradients.
template <typename T>
int PipelineExecutor<T>::tag(int64_t mb, int64_t receiving_chunk, PipeOp kind) const {
  const bool gradient = kind == PipeOp::RecvGradient || kind == PipeOp::SendGradient;
  return int(2 * (mb * int64_t(chunks_.size()) + receiving_chunk) + (gradient ? 1 : 0));
}

template <typename T>
void PipelineExecutor<T>::run_action(size_t i, const MicroBatches& micro_batches, double loss_scale) {
  const PipeAction& a = actions_[i];
  std::vector<Slot>& slots = slots_[size_t(a.chunk)];
  const int slot = int(a.micro_batch % int64_t(slots.size()));
  Slot& s = slots[size_t(slot)];
  Model<T>& model = *chunks_[size_t(a.chunk)];
  const int64_t v = virtual_stage(stages_, stage_, a.chunk);
  switch (a.op) {
    case PipeOp::RecvActivation:
      pp_.recv(s.received.template data<T>(), rows_, peer(a.chunk, stages_ - 1), tag(a.micro_batch, a.chunk, a.op));
      break;
    case PipeOp::Forward:
      micro_batches.tokens(a.micro_batch, tokens_.data());
      if (micro_batches.before_chunk_forward)
        micro_batches.before_chunk_forward(a.micro_batch, a.chunk);
      else
        micro_batches.before_forward(a.micro_batch);
      model.forward(slot, tokens_.data(), batch_, v == 0 ? nullptr : s.received.template data<T>());
      break;
    case PipeOp::SendActivation:
      send(s, s.activation_sent, s.activation_out, model.output_activation(slot), peer(a.chunk, 1),
           tag(a.micro_batch, (v + 1) / stages_, a.op));
      if (!receives_next(i)) s.activation_sent->test();  // start it now (see receives_next)
      break;
    case PipeOp::RecvGradient:
      pp_.recv(s.received.template data<T>(), rows_, peer(a.chunk, 1), tag(a.micro_batch, a.chunk, a.op));
      break;
    case PipeOp::Backward:
      model.backward(slot, loss_scale, model.stage().head ? nullptr : s.received.template data<T>());
      break;
    case PipeOp::SendGradient:
      send(s, s.gradient_sent, s.gradient_out, model.input_grad(slot), peer(a.chunk, stages_ - 1),
           tag(a.micro_batch, (v - 1) / stages_, a.op));
      if (!receives_next(i)) s.gradient_sent->test();
      break;
  }
}

template <typename T>
double PipelineExecutor<T>::run(const MicroBatches& micro_batches, double loss_scale) {
  // The last stage's per-token losses stay on the backend until every action has run: one read for the step.
  Model<T>* head = chunks_.back()->stage().head ? chunks_.back() : nullptr;
  if (head) head->stage_losses();
  for (size_t i = 0; i < actions_.size(); ++i) {
    if (micro_batches.around) micro_batches.around(actions_[i], true);
    run_action(i, micro_batches, loss_scale);
    if (micro_batches.around) micro_batches.around(actions_[i], false);
  }
  for (std::vector<Slot>& slots : slots_)
    for (Slot& s : slots)
      for (std::unique_ptr<Request>* r : {&s.activation_sent, &s.gradient_sent})
        if (*r) (*r)->wait(), r->reset();
  double loss = 0;  // the micro-batches' sums in the order of their forwards
  if (head)
    for (const double sum : head->staged_losses()) loss += sum;
  return loss;
}

template class PipelineExecutor<float>;
template class PipelineExecutor<double>;

}  // namespace moe
