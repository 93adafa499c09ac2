// The pipeline executor: a stage's actions over the pp group.
#include "parallel/pipeline.h"

#include <algorithm>

#include "core/error.h"

namespace moe {

int64_t pipeline_slots(PipeSchedule schedule, int64_t stages, int64_t stage, int64_t micro_batches) {
  int64_t in_flight = 0, most = 0;
  for (const PipeAction& a : pipeline_actions(schedule, stages, stage, micro_batches)) {
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
    : model_(stage),
      pp_(pp),
      stage_(pp.rank()),
      stages_(pp.size()),
      batch_(batch),
      seq_len_(seq_len),
      rows_(stage.rows(batch * seq_len) * stage.shape().d_model),
      actions_(pipeline_actions(schedule, pp.size(), pp.rank(), micro_batches)) {
  const int64_t slots = pipeline_slots(schedule, stages_, stage_, micro_batches);
  MOE_CHECK(stage.num_slots() >= slots, "pipeline stage " << stage_ << " keeps " << slots
                                                          << " micro-batches in flight; its model has "
                                                          << stage.num_slots() << " slots");
  MOE_CHECK(stage.stage().embedding == (stage_ == 0) && stage.stage().head == (stage_ == stages_ - 1),
            "pipeline stage " << stage_ << " of " << stages_ << ": the embedding belongs to the first stage "
                              << "and the head to the last");
  slots_.resize(size_t(slots));
  Backend& backend = stage.backend();
  for (Slot& s : slots_) {
    s.received = backend.allocate(dtype_of<T>(), rows_);
    s.activation_out = backend.allocate(dtype_of<T>(), rows_);
    s.gradient_out = backend.allocate(dtype_of<T>(), rows_);
  }
  tokens_.assign(size_t(batch * (seq_len + 1)), 0);
}

template <typename T>
PipelineExecutor<T>::~PipelineExecutor() = default;

// Waits for the slot's previous send of this kind, then sends a copy of `data`.
template <typename T>
void PipelineExecutor<T>::send(Slot& slot, std::unique_ptr<Request>& request, Buffer& buffer, const T* data, int peer,
                               int tag) {
  if (request) request->wait();
  model_.backend().copy(buffer.template data<T>(), data, size_t(rows_) * sizeof(T));
  model_.backend().synchronize();
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
double PipelineExecutor<T>::run(const MicroBatches& micro_batches, double loss_scale) {
  const bool first = stage_ == 0, last = stage_ == stages_ - 1;
  const int prev = int(stage_) - 1, next = int(stage_) + 1;
  double loss = 0;
  for (size_t i = 0; i < actions_.size(); ++i) {
    const PipeAction& a = actions_[i];
    Slot& s = slots_[size_t(a.micro_batch % int64_t(slots_.size()))];
    const int slot = int(a.micro_batch % int64_t(slots_.size()));
    const int activation_tag = int(2 * a.micro_batch), gradient_tag = int(2 * a.micro_batch + 1);
    if (micro_batches.around) micro_batches.around(a, true);
    switch (a.op) {
      case PipeOp::RecvActivation:
        pp_.recv(s.received.template data<T>(), rows_, prev, activation_tag);
        break;
      case PipeOp::Forward:
        micro_batches.tokens(a.micro_batch, tokens_.data());
        micro_batches.before_forward(a.micro_batch);
        loss += model_.forward(slot, tokens_.data(), batch_, first ? nullptr : s.received.template data<T>());
        break;
      case PipeOp::SendActivation:
        send(s, s.activation_sent, s.activation_out, model_.output_activation(slot), next, activation_tag);
        if (!receives_next(i)) s.activation_sent->test();  // start it now (see receives_next)
        break;
      case PipeOp::RecvGradient:
        pp_.recv(s.received.template data<T>(), rows_, next, gradient_tag);
        break;
      case PipeOp::Backward:
        model_.backward(slot, loss_scale, last ? nullptr : s.received.template data<T>());
        break;
      case PipeOp::SendGradient:
        send(s, s.gradient_sent, s.gradient_out, model_.input_grad(slot), prev, gradient_tag);
        if (!receives_next(i)) s.gradient_sent->test();
        break;
    }
    if (micro_batches.around) micro_batches.around(a, false);
  }
  for (Slot& s : slots_)
    for (std::unique_ptr<Request>* r : {&s.activation_sent, &s.gradient_sent})
      if (*r) (*r)->wait(), r->reset();
  return last ? loss : 0.0;
}

template class PipelineExecutor<float>;
template class PipelineExecutor<double>;

}  // namespace moe
