// loadstone._core.Loader and LoadHandle: loads that run on loadstone's threads while Python
// goes on. Every wait here releases the GIL; loadstone's threads take it only to run a Python
// callback (on_tensor_ready, on_done), never for their own work: the tensors that as_completed()
// yields wait in a C++ queue until Python asks for them.
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>

#include <nanobind/nanobind.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "errors.h"
#include "loadstone/loader.h"
#include "loadstone/offload.h"
#include "options.h"
#include "py_tensor.h"

namespace nb = nanobind;

namespace loadstone::python {
namespace {

bool InterpreterAlive() {
#if PY_VERSION_HEX >= 0x030D0000
  return nb::is_alive() && !Py_IsFinalizing();
#else
  return nb::is_alive() && !_Py_IsFinalizing();
#endif
}

// Set while this thread runs Python for a load (a callback, or dropping what a callback held):
// a Loader must not be destroyed there, since its destructor waits for its loads' callbacks.
thread_local bool t_in_callback = false;

struct CallbackScope {
  bool saved = t_in_callback;
  CallbackScope() { t_in_callback = true; }
  ~CallbackScope() { t_in_callback = saved; }
};

// Lets go of a Loader: at once (waiting for its loads, without the GIL), or, on a load's
// callback thread, on a thread of its own.
void Release(std::shared_ptr<Loader>& loader) {
  if (!loader) return;
  if (t_in_callback) {
    std::thread([l = std::move(loader)]() mutable { l.reset(); }).detach();
    return;
  }
  nb::gil_scoped_release unlocked;
  loader.reset();
}

// A Python object that loadstone's threads may drop: released under the GIL, or left alone once
// the interpreter is going away (it frees it then).
class PyRef {
 public:
  explicit PyRef(nb::object object) : object_(object.release()) {}
  ~PyRef() {
    if (!InterpreterAlive()) return;
    CallbackScope scope;
    nb::gil_scoped_acquire gil;
    object_.dec_ref();
  }
  PyRef(const PyRef&) = delete;
  PyRef& operator=(const PyRef&) = delete;
  nb::handle get() const { return object_; }

 private:
  nb::handle object_;
};

// Runs `call` (which touches Python) on a loadstone thread: under the GIL, with a Python
// exception turned into a C++ one (so the load fails with CallbackFailed, naming it).
template <typename F>
void RunPython(F&& call) {
  if (!InterpreterAlive()) return;
  std::string error;
  {
    CallbackScope scope;
    nb::gil_scoped_acquire gil;
    try {
      call();
    } catch (nb::python_error& e) {
      error = e.what();
    }
  }
  if (!error.empty()) throw std::runtime_error(error);
}

// Tensors as they land, for Python to take at its pace (as_completed, weights iterators).
struct Landed {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Tensor> queue;  // guarded by mu
  bool ended = false;        // guarded by mu: the load's end is known and queued after its tensors
};

// A load, and the Loader it runs on, which lives as long as the load's handle does.
struct PyLoad {
  std::shared_ptr<Loader> loader;
  LoadHandle handle;
  std::shared_ptr<Landed> landed;  // set by enable_landed
  std::once_flag landed_once;

  PyLoad(std::shared_ptr<Loader> l, LoadHandle h) : loader(std::move(l)), handle(std::move(h)) {}
  ~PyLoad() {
    {
      // Cancels and waits (unless done; not inside its own callback) without the GIL: the
      // load's callbacks may need it.
      nb::gil_scoped_release unlocked;
      handle = LoadHandle();
    }
    Release(loader);
  }
};

struct PyLoader {
  std::shared_ptr<Loader> loader;
  ~PyLoader() { Release(loader); }
};

// A timeout argument: seconds, or none (no limit). Read while the GIL is held.
std::optional<std::chrono::duration<double>> Seconds(nb::handle timeout) {
  if (timeout.is_none()) return std::nullopt;
  return std::chrono::duration<double>(nb::cast<double>(timeout));
}

template <typename Future>
bool WaitFor(const Future& future, nb::handle timeout) {
  const auto limit = Seconds(timeout);
  nb::gil_scoped_release unlocked;
  if (!limit) {
    future.wait();
    return true;
  }
  return future.wait_for(*limit) == std::future_status::ready;
}

void EnableLanded(PyLoad& load) {
  std::call_once(load.landed_once, [&] {
    auto landed = std::make_shared<Landed>();
    load.landed = landed;
    nb::gil_scoped_release unlocked;
    ThrowIfError(load.handle.OnTensor([landed](const Tensor& t) {
      std::lock_guard<std::mutex> lock(landed->mu);
      landed->queue.push_back(t);
      landed->cv.notify_all();
    }));
    ThrowIfError(load.handle.OnDone([landed](Status) {
      std::lock_guard<std::mutex> lock(landed->mu);
      landed->ended = true;
      landed->cv.notify_all();
    }));
  });
}

// (0, tensor) a tensor; (1, None) none yet within `timeout`; (2, None) no more will come.
nb::tuple NextLanded(PyLoad& load, nb::handle timeout) {
  EnableLanded(load);
  std::shared_ptr<Landed> landed = load.landed;
  std::optional<Tensor> next;
  bool ended = false;
  const auto limit = Seconds(timeout);
  {
    nb::gil_scoped_release unlocked;
    std::unique_lock<std::mutex> lock(landed->mu);
    auto ready = [&] { return !landed->queue.empty() || landed->ended; };
    if (!limit) {
      landed->cv.wait(lock, ready);
    } else {
      landed->cv.wait_for(lock, *limit, ready);
    }
    if (!landed->queue.empty()) {
      next = std::move(landed->queue.front());
      landed->queue.pop_front();
    } else {
      ended = landed->ended;
    }
  }
  if (next) return nb::make_tuple(0, ToPython(*next));
  return nb::make_tuple(ended ? 2 : 1, nb::none());
}

void InitLoader(PyLoader* self, const std::string& backend, int queue_depth, int worker_threads,
                uint64_t staging_bytes, bool direct_io, nb::handle platform,
                uint64_t bytes_in_flight) {
  LoaderOptions options;
  if (backend == "auto") {
    options.backend = ReadBackend::kAuto;
  } else if (backend == "uring" || backend == "io_uring") {
    options.backend = ReadBackend::kUring;
  } else if (backend == "pread") {
    options.backend = ReadBackend::kPread;
  } else {
    throw StatusError(Status::InvalidArgument("backend: 'auto', 'uring' or 'pread', not '" +
                                              backend + "'"));
  }
  if (queue_depth < 1) throw StatusError(Status::InvalidArgument("queue_depth: at least 1"));
  options.queue_depth = queue_depth;
  options.worker_threads = worker_threads;
  options.staging_bytes = staging_bytes;
  options.bytes_in_flight = bytes_in_flight;
  options.direct_io = direct_io;
  options.platform = ParsePlatform(platform);
  std::shared_ptr<Loader> loader;
  {
    nb::gil_scoped_release unlocked;
    loader = std::make_shared<Loader>(options);
  }
  new (self) PyLoader{std::move(loader)};
}

std::unique_ptr<PyLoad> StartLoad(PyLoader& self, const PyPlan& plan, nb::handle destinations,
                                  bool trace, uint64_t host_memory_limit) {
  LoadOptions options;
  options.trace = trace;
  options.host_memory_limit = host_memory_limit;
  if (!destinations.is_none()) {
    // name -> (address, bytes): memory the caller owns and keeps valid until the load is done
    // (LoadOptions::destination), looked up without Python on the Loader's thread.
    auto memory = std::make_shared<std::unordered_map<std::string, std::span<std::byte>>>();
    for (auto [name, spec] : nb::cast<nb::dict>(destinations)) {
      auto [address, bytes] = nb::cast<std::tuple<uintptr_t, uint64_t>>(spec);
      memory->emplace(nb::cast<std::string>(name),
                      std::span<std::byte>(reinterpret_cast<std::byte*>(address), bytes));
    }
    options.destination = [memory](const TensorInfo& t, const TensorPlan&) {
      auto it = memory->find(t.name);
      return it == memory->end() ? std::span<std::byte>() : it->second;
    };
  }
  nb::gil_scoped_release unlocked;
  return std::make_unique<PyLoad>(self.loader,
                                  self.loader->Load(plan.checkpoint, *plan.plan, options));
}

nb::dict WriteOffloadFor(PyLoader& self, const PyPlan& plan, uint64_t batch_bytes) {
  OffloadOptions options;
  options.batch_bytes = batch_bytes;
  Result<OffloadSummary> summary = [&] {
    nb::gil_scoped_release unlocked;
    return WriteOffload(*self.loader, plan.checkpoint, *plan.plan, options);
  }();
  const OffloadSummary& s = ValueOrThrow(std::move(summary));
  nb::dict d;
  d["index_path"] = s.index_path;
  d["written"] = s.written;
  d["bytes_written"] = s.bytes_written;
  d["bytes_read"] = s.bytes_read;
  d["in_place"] = s.in_place;
  return d;
}

// LoadHandle's waits and callbacks (wait ... next_landed).
// `callback(error_or_None)`, called with the GIL from a load's callback thread.
std::function<void(Status)> StatusCallback(nb::object callback) {
  auto cb = std::make_shared<PyRef>(std::move(callback));
  return [cb](Status s) {
    RunPython([&] { cb->get()(s.ok() ? nb::none() : MakeException(s)); });
  };
}

void DefineWaits(nb::class_<PyLoad>& handle) {
  handle
      .def("wait", [](PyLoad& l, nb::handle timeout) { return WaitFor(l.handle.Done(), timeout); },
           nb::arg("timeout") = nb::none(),
           "Waits (without the GIL) until the load has ended or `timeout` seconds passed; "
           "True when it has ended.")
      .def("error", [](PyLoad& l) -> nb::object {
        auto done = l.handle.Done();
        if (done.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return nb::none();
        const Status& s = done.get();
        return s.ok() ? nb::none() : MakeException(s);
      }, "None while running or when the load succeeded; else its exception object.")
      .def("wait_tensor", [](PyLoad& l, const std::string& name, nb::handle timeout) -> nb::object {
        auto future = l.handle.Tensor(name);
        if (!WaitFor(future, timeout)) return nb::none();
        Tensor t;
        {
          nb::gil_scoped_release unlocked;
          t = future.get();  // throws loadstone::Error: translated
        }
        return ToPython(t);
      }, nb::arg("name"), nb::arg("timeout") = nb::none())
      .def("on_tensor_ready", [](PyLoad& l, const std::string& name, nb::object callback) {
        auto cb = std::make_shared<PyRef>(std::move(callback));
        ThrowIfError(l.handle.OnTensorReady(name, [cb](Status s, Tensor t) {
          RunPython([&] {
            if (s.ok()) {
              cb->get()(nb::none(), ToPython(t));
            } else {
              cb->get()(MakeException(s), nb::none());
            }
          });
        }));
      }, nb::arg("name"), nb::arg("callback"),
           "callback(error, tensor) once, on the load's callback thread (with the GIL).")
      .def("on_module_ready", [](PyLoad& l, const std::string& prefix, nb::object callback) {
        ThrowIfError(l.handle.OnModuleReady(prefix, StatusCallback(std::move(callback))));
      }, nb::arg("prefix"), nb::arg("callback"),
           "callback(error_or_None) once every tensor of module `prefix` is in place.")
      .def("on_modules", [](PyLoad& l, nb::object callback) {
        auto cb = std::make_shared<PyRef>(std::move(callback));
        ThrowIfError(l.handle.OnModules([cb](const PlanModule& m, Status s) {
          RunPython([&] { cb->get()(m.prefix, s.ok() ? nb::none() : MakeException(s)); });
        }));
      }, nb::arg("callback"),
           "callback(prefix, error_or_None) for each module of the plan's order, in order.")
      .def("prioritize", [](PyLoad& l, const std::string& prefix) {
        ThrowIfError(l.handle.Prioritize(prefix));
      }, nb::arg("prefix"), "Moves module `prefix`'s pending reads to the front.")
      .def("on_done", [](PyLoad& l, nb::object callback) {
        ThrowIfError(l.handle.OnDone(StatusCallback(std::move(callback))));
      }, nb::arg("callback"), "callback(error_or_None) once the load has ended.")
      .def("next_landed", &NextLanded, nb::arg("timeout") = nb::none(),
           "(0, tensor) for the next tensor to land (each once, in landing order), (1, None) "
           "when none came within `timeout`, (2, None) when no more will come.");
}

// LoadHandle's results and controls (tensors ... write_trace).
void DefineResults(nb::class_<PyLoad>& handle) {
  handle
      .def("tensors", [](PyLoad& l) {
        std::vector<Tensor> all;
        {
          nb::gil_scoped_release unlocked;
          all = l.handle.Tensors();
        }
        nb::list out;
        for (const Tensor& t : all) out.append(ToPython(t));
        return out;
      }, "Every tensor once the load succeeded, in plan order; [] before.")
      .def("progress", [](PyLoad& l) { return ProgressDict(l.handle.progress()); })
      .def_prop_ro("backend", [](PyLoad& l) {
        nb::gil_scoped_release unlocked;
        return l.handle.backend();
      })
      .def("read_stats", [](PyLoad& l) { return ReadStatsDict(l.handle.read_stats()); })
      .def("late_callback_error", [](PyLoad& l) -> nb::object {
        Status s = l.handle.late_callback_error();
        return s.ok() ? nb::none() : MakeException(s);
      })
      .def("cancel", [](PyLoad& l) {
        nb::gil_scoped_release unlocked;
        l.handle.Cancel();
      })
      .def("write_trace", [](PyLoad& l, const std::string& path) {
        Status s;
        {
          nb::gil_scoped_release unlocked;
          s = l.handle.WriteTrace(path);
        }
        ThrowIfError(s);
      });
}

}  // namespace

void RegisterLoad(nb::module_& m) {
  nb::class_<PyLoad> handle(m, "LoadHandle", "One running load (see loadstone.LoadHandle).");
  DefineWaits(handle);
  DefineResults(handle);
  nb::class_<PyLoader>(m, "Loader", "loadstone's Loader: reusable, thread-safe.")
      .def("__init__", &InitLoader, nb::arg("backend") = "auto", nb::arg("queue_depth") = 32,
           nb::arg("worker_threads") = 0, nb::arg("staging_bytes") = 256ULL << 20,
           nb::arg("direct_io") = true, nb::arg("platform") = nb::none(),
           nb::arg("bytes_in_flight") = 0)
      .def("load", &StartLoad, nb::arg("plan"), nb::arg("destinations") = nb::none(),
           nb::arg("trace") = false, nb::arg("host_memory_limit") = 0)
      .def("write_offload", &WriteOffloadFor, nb::arg("plan"),
           nb::arg("batch_bytes") = 256ULL << 20)
      .def("cancel_all", [](PyLoader& l) { l.loader->CancelAll(); })
      .def_prop_ro("platform", [](PyLoader& l) { return l.loader->platform()->description(); });
}

}  // namespace loadstone::python
