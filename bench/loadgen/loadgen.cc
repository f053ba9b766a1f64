// The compiled load side of bench/hot_path.py: exactly what bench/lean_load.py's LeanLoad does,
// without the Python client's per-message cost (~110 us of CPU per write + read and two asyncio
// task hops per phase instance).
//
// Usage: loadgen SPEC_FILE   (written by bench/cxx_load.py; Python owns the workload rule)
//
// The spec names the controller, the job, the streams' ranks, each phase's serialized
// lightrail.v1.PhaseKey, the enters of boundary 0 and, per phase id, what its completion does
// on each stream (LeanLoad._moves()). This program only executes it:
//   * one channel + one PhaseStream per stream; the first write of each is the DefinePhase
//     batch, then every rank enters the first phase of its sequence in boundary 0;
//   * a blocking reader thread per stream (ClientReaderWriter::Read) records each AdmitMany
//     (arrival time taken right after Read returns); the reader whose batch completes a phase
//     instance (every rank admitted) handles the completion itself, under the one mutex that
//     also serializes every write: per stream ONE message with its releases, then its enters
//     (request ids increasing, timeout_s, job_id), send times recorded just before the writes,
//     released_s just after them;
//   * warm-up, stop_at / max_measured_s cap and the "measuring" moment as LeanLoad._drive.
// Times: std::chrono::steady_clock (CLOCK_MONOTONIC, as Python's perf_counter), seconds as a
// double; only differences are used.
//
// stdout: the line "measuring" (flushed) when the writes that start the first measured
// boundary go out, then the results (format in print_results). A PhaseError reply, a failed
// stream, or the cell timeout: a message on stderr, exit status 1. A bad spec: exit status 2.

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "lightrail/v1/agent.grpc.pb.h"

namespace pb = lightrail::v1;

namespace {

using Ranks = std::vector<uint32_t>;

double now_s() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double process_cpu_s() {  // every thread of this process
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// --- spec ----------------------------------------------------------------------------------

// LeanLoad's _Move: ``ranks`` release the phase (empty for the second and later entries of a
// stream); ``next_ranks`` enter ``next_pid`` (none when !has_next), in the next boundary when
// ``wraps``.
struct Move {
  int stream = 0;
  Ranks ranks;
  bool has_next = false;
  int next_pid = 0;
  bool wraps = false;
  Ranks next_ranks;
};

struct FirstEnter {  // boundary 0: ``ranks`` of ``stream`` enter ``pid``
  int stream = 0;
  int pid = 0;
  Ranks ranks;
};

struct Spec {
  std::string target;
  std::string job_id;
  double timeout_s = 30.0;
  double cell_timeout_s = 90.0;
  double max_measured_s = 6.0;
  int64_t warmup = 0;
  int64_t stop_at = 0;
  std::vector<std::string> phase_keys;  // serialized PhaseKey per phase id
  std::vector<int> phase_sizes;         // ranks of each phase's group
  std::vector<Ranks> streams;
  std::vector<FirstEnter> first;
  std::vector<std::vector<Move>> moves;  // per phase id
};

[[noreturn]] void bad_spec(const std::string& path, int line, const std::string& what) {
  std::fprintf(stderr, "loadgen: spec %s line %d: %s\n", path.c_str(), line, what.c_str());
  std::exit(2);
}

std::string unhex(const std::string& hex) {
  if (hex == "-") return {};
  if (hex.size() % 2 != 0) throw std::runtime_error("odd-length hex");
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  }
  return out;
}

Ranks read_ranks(std::istringstream& in) {
  size_t count = 0;
  if (!(in >> count)) throw std::runtime_error("missing rank count");
  Ranks out(count);
  for (auto& r : out) {
    if (!(in >> r)) throw std::runtime_error("missing rank");
  }
  return out;
}

// Line format (one record per line, fields separated by spaces; "-" = none):
//   lightrail-loadgen-spec 1
//   target HOST:PORT | job_id ID | timeout_s S | cell_timeout_s S | max_measured_s S
//   warmup B | stop_at B
//   phase PID SIZE HEX                      (PIDs 0, 1, ... in order)
//   stream K COUNT RANK...                  (K 0, 1, ... in order)
//   first K PID COUNT RANK...               (LeanLoad._drive's boundary-0 enters, in order)
//   move PID K NEXT_PID|- WRAPS COUNT RANK... COUNT RANK...   (releases, then next_ranks)
//   end
Spec read_spec(const std::string& path) {
  std::ifstream file(path);
  if (!file) bad_spec(path, 0, "cannot open");
  Spec spec;
  std::string line;
  int lineno = 0;
  bool ended = false;
  while (std::getline(file, line)) {
    ++lineno;
    if (line.empty()) continue;
    std::istringstream in(line);
    std::string kw;
    in >> kw;
    try {
      if (lineno == 1) {
        int version = 0;
        if (kw != "lightrail-loadgen-spec" || !(in >> version) || version != 1) {
          bad_spec(path, lineno, "not a version 1 loadgen spec");
        }
      } else if (kw == "target") {
        in >> spec.target;
      } else if (kw == "job_id") {
        in >> spec.job_id;
      } else if (kw == "timeout_s") {
        in >> spec.timeout_s;
      } else if (kw == "cell_timeout_s") {
        in >> spec.cell_timeout_s;
      } else if (kw == "max_measured_s") {
        in >> spec.max_measured_s;
      } else if (kw == "warmup") {
        in >> spec.warmup;
      } else if (kw == "stop_at") {
        in >> spec.stop_at;
      } else if (kw == "phase") {
        size_t pid = 0;
        int size = 0;
        std::string hex;
        in >> pid >> size >> hex;
        if (pid != spec.phase_keys.size()) bad_spec(path, lineno, "phase ids out of order");
        spec.phase_keys.push_back(unhex(hex));
        spec.phase_sizes.push_back(size);
      } else if (kw == "stream") {
        size_t k = 0;
        in >> k;
        if (k != spec.streams.size()) bad_spec(path, lineno, "stream ids out of order");
        spec.streams.push_back(read_ranks(in));
      } else if (kw == "first") {
        FirstEnter f;
        in >> f.stream >> f.pid;
        f.ranks = read_ranks(in);
        spec.first.push_back(std::move(f));
      } else if (kw == "move") {
        size_t pid = 0;
        Move m;
        std::string next;
        int wraps = 0;
        in >> pid >> m.stream >> next >> wraps;
        m.has_next = next != "-";
        if (m.has_next) m.next_pid = std::stoi(next);
        m.wraps = wraps != 0;
        m.ranks = read_ranks(in);
        m.next_ranks = read_ranks(in);
        if (spec.moves.size() <= pid) spec.moves.resize(pid + 1);
        spec.moves[pid].push_back(std::move(m));
      } else if (kw == "end") {
        ended = true;
        break;
      } else {
        bad_spec(path, lineno, "unknown record " + kw);
      }
    } catch (const std::exception& e) {
      bad_spec(path, lineno, e.what());
    }
    if (in.fail()) bad_spec(path, lineno, "malformed " + kw);
  }
  if (!ended) bad_spec(path, lineno, "no end record (truncated)");
  const auto phases = static_cast<int>(spec.phase_keys.size());
  const auto nstreams = static_cast<int>(spec.streams.size());
  if (spec.target.empty() || spec.job_id.empty() || phases == 0 || nstreams == 0) {
    bad_spec(path, lineno, "target, job_id, a phase and a stream are required");
  }
  spec.moves.resize(spec.phase_keys.size());
  for (const auto& f : spec.first) {
    if (f.stream < 0 || f.stream >= nstreams || f.pid < 0 || f.pid >= phases) {
      bad_spec(path, lineno, "first: stream or phase out of range");
    }
  }
  for (const auto& ms : spec.moves) {
    for (const auto& m : ms) {
      if (m.stream < 0 || m.stream >= nstreams || (m.has_next && (m.next_pid < 0 ||
                                                                 m.next_pid >= phases))) {
        bad_spec(path, lineno, "move: stream or phase out of range");
      }
    }
  }
  return spec;
}

// --- results -------------------------------------------------------------------------------

// LeanLoad's PhaseInstance: one phase of one boundary.
struct Instance {
  explicit Instance(int size) : expected(size) {}

  int expected;
  double last_send_s = 0.0;
  double first_send_s = INFINITY;
  std::vector<double> admit_s;
  std::vector<int> admit_n;
  int admitted = 0;
  bool switched = false;
  double device_s = 0.0;
  double released_s = 0.0;

  void sent(double at_s) {
    last_send_s = std::max(last_send_s, at_s);
    first_send_s = std::min(first_send_s, at_s);
  }

  bool admit(double at_s, int n, bool noop, double dev_s) {  // true: that completes it
    admit_s.push_back(at_s);
    admit_n.push_back(n);
    admitted += n;
    if (!noop) {
      switched = true;
      device_s = std::max(device_s, dev_s);
    }
    return admitted >= expected;
  }
};

struct Key {  // (stream, boundary, phase id), as LeanLoad's dict keys
  int stream;
  int64_t b;
  int pid;
  bool operator==(const Key& o) const {
    return stream == o.stream && b == o.b && pid == o.pid;
  }
};

// An insertion-ordered (stream, boundary, phase) -> ranks map: a Python dict's semantics
// (assignment to an existing key keeps its place).
class Entries {
 public:
  void put(Key key, const Ranks* ranks) {
    for (auto& e : items_) {
      if (e.first == key) {
        e.second = ranks;
        return;
      }
    }
    items_.emplace_back(key, ranks);
  }
  const std::vector<std::pair<Key, const Ranks*>>& items() const { return items_; }

 private:
  std::vector<std::pair<Key, const Ranks*>> items_;
};

// --- the load ------------------------------------------------------------------------------

class Load {
 public:
  explicit Load(Spec spec) : spec_(std::move(spec)), stop_at_(spec_.stop_at) {
    const auto k = spec_.streams.size();
    for (size_t i = 0; i < k; ++i) {
      channels_.push_back(grpc::CreateChannel(spec_.target, grpc::InsecureChannelCredentials()));
      stubs_.push_back(pb::AgentService::NewStub(channels_.back()));
      contexts_.push_back(std::make_unique<grpc::ClientContext>());
    }
    instances_.resize(static_cast<size_t>(stop_at_ + 1));
    for (auto& row : instances_) {
      for (int size : spec_.phase_sizes) row.emplace_back(size);
    }
    for (const auto& s : spec_.streams) open_ranks_ += static_cast<int64_t>(s.size());
  }

  // Open the streams, run every boundary, close. Returns 0, or 1 after printing the error.
  int run() {
    pb::PhaseRequestBatch defines;
    for (size_t pid = 0; pid < spec_.phase_keys.size(); ++pid) {
      auto* d = defines.add_requests()->mutable_define_phase();
      d->set_phase_id(static_cast<uint32_t>(pid));
      if (!d->mutable_phase()->ParseFromString(spec_.phase_keys[pid])) {
        die("phase " + std::to_string(pid) + ": its PhaseKey bytes do not parse");
      }
    }
    for (size_t k = 0; k < stubs_.size(); ++k) {
      calls_.push_back(stubs_[k]->PhaseStream(contexts_[k].get()));
      if (!calls_.back()->Write(defines)) {
        die("stream " + std::to_string(k) + ": the DefinePhase write failed: " +
                   finish_status(static_cast<int>(k)));
      }
    }
    for (size_t k = 0; k < calls_.size(); ++k) {
      readers_.emplace_back([this, k] { read(static_cast<int>(k)); });
    }
    const auto deadline =
        std::chrono::steady_clock::now() +
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::duration<double>(spec_.cell_timeout_s));
    std::unique_lock<std::mutex> lk(mu_);
    drive_start();
    if (!cv_.wait_until(lk, deadline, [this] { return finished_ || !error_.empty(); })) {
      error_ = "cell did not finish within " + fmt(spec_.cell_timeout_s) + " s: " +
               describe_incomplete();
    }
    if (!error_.empty()) die(error_);
    lk.unlock();
    for (auto& ctx : contexts_) ctx->TryCancel();  // as LeanLoad: the calls are cancelled
    for (auto& t : readers_) t.join();
    cpu_end_s_ = process_cpu_s();
    print_results();
    calls_.clear();
    return 0;
  }

 private:
  static std::string fmt(double v) {
    std::ostringstream out;
    out << v;
    return out.str();
  }

  [[noreturn]] static void die(const std::string& msg) {
    std::fprintf(stderr, "loadgen: %s\n", msg.c_str());
    std::fflush(stderr);
    std::fflush(stdout);
    std::_Exit(1);  // reader threads may still be blocked in Read
  }

  std::string finish_status(int k) {
    const grpc::Status st = calls_[static_cast<size_t>(k)]->Finish();
    return "status " + std::to_string(static_cast<int>(st.error_code())) + " " +
           st.error_message();
  }

  void fail(const std::string& msg) {  // under mu_
    if (error_.empty()) error_ = msg;
    cv_.notify_all();
  }

  std::string describe_incomplete() const {  // under mu_
    std::string out;
    int shown = 0;
    for (size_t b = 0; b < instances_.size() && shown < 6; ++b) {
      for (size_t pid = 0; pid < instances_[b].size() && shown < 6; ++pid) {
        const Instance& inst = instances_[b][pid];
        if (std::isfinite(inst.first_send_s) && inst.admitted < inst.expected) {
          out += (shown ? "; " : "") + std::string("boundary ") + std::to_string(b) +
                 " phase " + std::to_string(pid) + ": " + std::to_string(inst.admitted) +
                 " of " + std::to_string(inst.expected) + " admitted";
          ++shown;
        }
      }
    }
    return shown ? out : "no phase instance waits";
  }

  void read(int k) {
    pb::PhaseReplyBatch batch;
    auto& call = *calls_[static_cast<size_t>(k)];
    while (call.Read(&batch)) {
      const double at_s = now_s();
      std::lock_guard<std::mutex> lk(mu_);
      if (finished_ || !error_.empty()) return;
      for (const auto& rep : batch.replies()) {
        if (rep.kind_case() == pb::PhaseReply::kAdmittedMany) {
          const auto& m = rep.admitted_many();
          if (m.iteration() >= instances_.size() ||
              m.phase_id() >= spec_.phase_keys.size()) {
            fail("stream " + std::to_string(k) + ": AdmitMany for boundary " +
                 std::to_string(m.iteration()) + " phase " + std::to_string(m.phase_id()) +
                 ", which this load never entered");
            return;
          }
          const auto b = static_cast<int64_t>(m.iteration());
          const auto pid = static_cast<int>(m.phase_id());
          if (instance(b, pid).admit(at_s, m.ranks_size(), m.noop(), m.device_s())) {
            complete(b, pid);
            if (!error_.empty()) return;
          }
        } else if (rep.kind_case() == pb::PhaseReply::kError) {
          const auto& err = rep.error();
          fail("stream " + std::to_string(k) + ": rank " + std::to_string(err.rank()) +
               " refused (" + pb::PhaseErrorCode_Name(err.code()) + "): " + err.message());
          return;
        } else {
          fail("stream " + std::to_string(k) + ": unexpected per-rank reply (PhaseReply kind " +
               std::to_string(static_cast<int>(rep.kind_case())) + ")");
          return;
        }
      }
    }
    std::lock_guard<std::mutex> lk(mu_);
    if (!finished_ && error_.empty()) {
      fail("stream " + std::to_string(k) + " ended: " + finish_status(k));
    }
  }

  Instance& instance(int64_t b, int pid) {
    return instances_[static_cast<size_t>(b)][static_cast<size_t>(pid)];
  }

  void measuring() {  // under mu_: LeanLoad._measuring (on_measured = this line)
    std::fputs("measuring\n", stdout);
    std::fflush(stdout);
    cpu_measured_s_ = process_cpu_s();
    measured_ = true;
    t_cap_ = now_s() + spec_.max_measured_s;
  }

  void drive_start() {  // under mu_: LeanLoad._drive up to its loop
    if (spec_.warmup == 0) measuring();
    Entries enters;
    for (const auto& f : spec_.first) enters.put(Key{f.stream, 0, f.pid}, &f.ranks);
    write(Entries{}, enters);
  }

  void complete(int64_t b, int pid) {  // under mu_: one turn of LeanLoad._drive's loop
    Instance& inst = instance(b, pid);
    if (measured_ && now_s() > t_cap_) {  // stop after the latest boundary entered
      stop_at_ = std::min(stop_at_, std::max(max_entered_ + 1, spec_.warmup + 5));
    }
    Entries releases;
    Entries enters;
    const bool more = b + 1 < stop_at_;
    for (const Move& move : spec_.moves[static_cast<size_t>(pid)]) {
      if (!move.ranks.empty()) releases.put(Key{move.stream, b, pid}, &move.ranks);
      if (!move.has_next) continue;
      if (move.wraps) {
        if (!more) {
          open_ranks_ -= static_cast<int64_t>(move.next_ranks.size());
          continue;
        }
        enters.put(Key{move.stream, b + 1, move.next_pid}, &move.next_ranks);
      } else {
        enters.put(Key{move.stream, b, move.next_pid}, &move.next_ranks);
      }
    }
    if (!measured_) {
      for (const auto& e : enters.items()) {
        if (e.first.b == spec_.warmup) {
          measuring();
          break;
        }
      }
    }
    if (!write(releases, enters)) return;
    inst.released_s = now_s();
    if (open_ranks_ <= 0) {
      finished_ = true;
      cv_.notify_all();
    }
  }

  // Per stream one message: its releases, then its enters (LeanLoad._write). False after a
  // failed write (recorded in error_).
  bool write(const Entries& releases, const Entries& enters) {  // under mu_
    std::vector<std::pair<int, pb::PhaseRequestBatch>> per_stream;
    auto batch_of = [&per_stream](int k) -> pb::PhaseRequestBatch& {
      for (auto& e : per_stream) {
        if (e.first == k) return e.second;
      }
      per_stream.emplace_back(k, pb::PhaseRequestBatch{});
      return per_stream.back().second;
    };
    for (const auto& [key, ranks] : releases.items()) {
      auto* r = batch_of(key.stream).add_requests()->mutable_release_many();
      r->set_job_id(spec_.job_id);
      r->set_phase_id(static_cast<uint32_t>(key.pid));
      r->set_iteration(static_cast<uint64_t>(key.b));
      r->mutable_ranks()->Add(ranks->begin(), ranks->end());
    }
    for (const auto& [key, ranks] : enters.items()) {
      auto* e = batch_of(key.stream).add_requests()->mutable_enter_many();
      e->set_job_id(spec_.job_id);
      e->set_phase_id(static_cast<uint32_t>(key.pid));
      e->set_iteration(static_cast<uint64_t>(key.b));
      e->mutable_ranks()->Add(ranks->begin(), ranks->end());
      e->set_request_id(++request_id_);
      e->set_timeout_s(spec_.timeout_s);
      max_entered_ = std::max(max_entered_, key.b);
    }
    const double t = now_s();
    for (const auto& e : enters.items()) instance(e.first.b, e.first.pid).sent(t);
    for (const auto& [k, batch] : per_stream) {
      if (!calls_[static_cast<size_t>(k)]->Write(batch)) {
        fail("stream " + std::to_string(k) + ": write failed (the stream is closed)");
        return false;
      }
    }
    return true;
  }

  // stdout after "measuring" (every field separated by one space, times in seconds):
  //   stop_at B
  //   max_entered B
  //   cpu AT_MEASURED_S|- END_S          (this process's CPU, all threads)
  //   inst B PID EXPECTED FIRST_SEND|inf LAST_SEND RELEASED SWITCHED DEVICE_S COUNT (AT N)...
  //   end
  // one inst line per boundary 0..initial stop_at and phase id.
  void print_results() const {
    std::string out;
    char buf[96];
    std::snprintf(buf, sizeof buf, "stop_at %lld\nmax_entered %lld\n",
                  static_cast<long long>(stop_at_), static_cast<long long>(max_entered_));
    out += buf;
    if (measured_) {
      std::snprintf(buf, sizeof buf, "cpu %.9f %.9f\n", cpu_measured_s_, cpu_end_s_);
    } else {
      std::snprintf(buf, sizeof buf, "cpu - %.9f\n", cpu_end_s_);
    }
    out += buf;
    for (size_t b = 0; b < instances_.size(); ++b) {
      for (size_t pid = 0; pid < instances_[b].size(); ++pid) {
        const Instance& i = instances_[b][pid];
        std::snprintf(buf, sizeof buf, "inst %zu %zu %d ", b, pid, i.expected);
        out += buf;
        if (std::isfinite(i.first_send_s)) {
          std::snprintf(buf, sizeof buf, "%.9f", i.first_send_s);
        } else {
          std::snprintf(buf, sizeof buf, "inf");
        }
        out += buf;
        std::snprintf(buf, sizeof buf, " %.9f %.9f %d %.9f %zu", i.last_send_s, i.released_s,
                      i.switched ? 1 : 0, i.device_s, i.admit_s.size());
        out += buf;
        for (size_t j = 0; j < i.admit_s.size(); ++j) {
          std::snprintf(buf, sizeof buf, " %.9f %d", i.admit_s[j], i.admit_n[j]);
          out += buf;
        }
        out += '\n';
      }
    }
    out += "end\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
  }

  Spec spec_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<pb::AgentService::Stub>> stubs_;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts_;
  std::vector<std::unique_ptr<grpc::ClientReaderWriter<pb::PhaseRequestBatch,
                                                       pb::PhaseReplyBatch>>>
      calls_;
  std::vector<std::thread> readers_;

  std::mutex mu_;  // guards everything below, and every write
  std::condition_variable cv_;
  std::vector<std::vector<Instance>> instances_;
  int64_t stop_at_;
  int64_t max_entered_ = 0;  // the latest boundary any rank entered
  int64_t open_ranks_ = 0;   // ranks not yet past the last boundary
  uint64_t request_id_ = 0;
  bool measured_ = false;
  double t_cap_ = 0.0;
  double cpu_measured_s_ = 0.0;
  double cpu_end_s_ = 0.0;
  bool finished_ = false;
  std::string error_;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s SPEC_FILE (written by bench/cxx_load.py)\n", argv[0]);
    return 2;
  }
  Load load(read_spec(argv[1]));
  return load.run();
}
