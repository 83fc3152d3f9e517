// Starting a load, on the loop thread: the plan's verdict (CheckPlanFor, made when the load was
// made) acted on, the files checked, the reader opened, the planned devices resolved, each
// read's route and each tensor's conversion site for this load, fresh pages and the staging
// pool sized.
#include <fmt/format.h>

#include "runtime/pipeline/load_state.h"

namespace loadstone {

void LoadHandle::State::Start() {
  Begin();
  Schedule();
  started_promise.set_value();  // backend() has its final text (or the load failed)
}

void LoadHandle::State::Begin() {
  trace.NameThread("event loop");
  if (!plan_error.ok()) return Fail(plan_error);
  // Files that changed since Open are found before any byte is read or mapped from them.
  for (uint32_t f = 0; f < checkpoint.files().size(); ++f) {
    if (Status s = read_.CheckFileSize(f, 0); !s.ok()) return Fail(s);
  }
  // A callback that throws fails the load (the Loader is alive: it waits for Done()).
  callbacks.OnFailure([weak = weak_from_this()](Status status) {
    if (auto self = weak.lock()) {
      State* state = self.get();
      state->OnLoop([state, status = std::move(status)] {
        if (!state->finished) state->Fail(status);
      });
    }
  });
  auto described = read_.Open();
  if (!described.ok()) return Fail(described.status());
  {
    std::lock_guard lock(callbacks_mu);
    backend_description = std::move(*described);
  }
  if (Status s = OpenDestinations(); !s.ok()) return Fail(s);
  read_.SettleRoutes();
  placement_.SiteConversions();
  read_.SizeStaging();

  for (uint32_t i = 0; i < tensors.size(); ++i) {
    if (tensors.empty(i)) {
      if (Status s = tensors.Ensure(i, destinations_); !s.ok()) return Fail(s);
      Advance(i, 0);
    }
  }
  ArmCompletions();
  // On the loop itself: taken before the first read is issued, not after.
  if (hooks_.cancel_at && hooks_.cancel_at(LoadStage::kBeforeFirstRead)) {
    return Fail(Status::Cancelled("the load was cancelled"));
  }
}

void LoadHandle::State::ArmCompletions() {
  read_.Arm([self = shared_from_this()](const asio::error_code& ec) {
    if (ec == asio::error::operation_aborted || self->finished) return;
    self->read_.OnCompletions();
    self->Schedule();
    if (!self->finished) self->ArmCompletions();
  });
}

Status LoadHandle::State::OpenDestinations() {
  LOADSTONE_RETURN_IF_ERROR(destinations_.Resolve(device_log));
  if (plan.routes.mmap) LOADSTONE_RETURN_IF_ERROR(destinations_.MapFiles());
  const bool refuse_fresh = hooks_.refuse_userfaultfd && hooks_.refuse_userfaultfd();
  for (const std::string& note :
       {destinations_.OpenFreshPages(refuse_fresh), destinations_.PinnedNote()}) {
    if (!note.empty()) Note(note);
  }
  return Status::OK();
}

}  // namespace loadstone
