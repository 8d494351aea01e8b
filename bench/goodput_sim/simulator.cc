#include "bench/goodput_sim/simulator.h"

#include <algorithm>
#include <deque>
#include <queue>
#include <random>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace duet::goodput_sim {
namespace {

enum class EventKind { kArrival, kStepDone, kKvLanded };

struct Event {
  double t = 0;
  int64_t order = 0;  // ties: first pushed, first served
  EventKind kind = EventKind::kArrival;
  int unit = 0;
  int request = 0;
};

struct Later {
  bool operator()(const Event& a, const Event& b) const {
    return a.t != b.t ? a.t > b.t : a.order > b.order;
  }
};

class EventQueue {
 public:
  void Push(double t, EventKind kind, int unit, int request) {
    heap_.push({t, next_order_++, kind, unit, request});
  }
  bool Empty() const { return heap_.empty(); }
  double NextTime() const { return heap_.top().t; }
  Event Pop() {
    Event e = heap_.top();
    heap_.pop();
    return e;
  }

 private:
  std::priority_queue<Event, std::vector<Event>, Later> heap_;
  int64_t next_order_ = 0;
};

// Where a request stands.
struct Progress {
  int prefilled = 0;  // prompt tokens computed
  int generated = 0;  // output tokens out, the first included
  double first_ms = -1;
  double last_ms = -1;
  bool done = false;
};

struct Chunk {
  int request = 0;
  int tokens = 0;
};

absl::Status CheckInputs(const std::vector<Request>& requests, const SchedulerLimits& limits) {
  if (limits.max_batch_tokens < 1 || limits.max_running < 1 ||
      limits.max_running > limits.max_batch_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("scheduler limits need 1 <= max_running <= max_batch_tokens, got max_running ",
                     limits.max_running, ", max_batch_tokens ", limits.max_batch_tokens));
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    const Request& r = requests[i];
    if (r.prompt_tokens < 1 || r.output_tokens < 1 || !(r.arrival_ms >= 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "request ", i, ": needs prompt_tokens >= 1, output_tokens >= 1, arrival_ms >= 0; got ",
          r.prompt_tokens, ", ", r.output_tokens, ", ", r.arrival_ms));
    }
  }
  return absl::OkStatus();
}

// Takes prompt chunks from the front of `waiting` (FCFS) into `chunks` under `budget` tokens;
// a request not started yet needs one of `slots`.
int64_t TakeChunks(const std::deque<int>& waiting, const std::vector<Request>& requests,
                   const std::vector<Progress>& progress, int64_t budget, int slots,
                   std::vector<Chunk>& chunks) {
  int64_t tokens = 0;
  for (int id : waiting) {
    if (budget <= 0) break;
    if (progress[id].prefilled == 0) {
      if (slots <= 0) break;
      --slots;
    }
    const int take = static_cast<int>(
        std::min<int64_t>(requests[id].prompt_tokens - progress[id].prefilled, budget));
    chunks.push_back({id, take});
    budget -= take;
    tokens += take;
  }
  return tokens;
}

int64_t ContextTokens(const std::vector<int>& decodes, const std::vector<Request>& requests,
                      const std::vector<Progress>& progress) {
  int64_t context = 0;
  for (int id : decodes) context += requests[id].prompt_tokens + progress[id].generated;
  return context;
}

std::vector<Outcome> Outcomes(const std::vector<Request>& requests,
                              const std::vector<Progress>& progress,
                              double first_token_latency_ms) {
  std::vector<Outcome> out(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    out[i].ttft_ms = progress[i].first_ms - requests[i].arrival_ms + first_token_latency_ms;
    if (requests[i].output_tokens > 1) {
      out[i].tpot_ms =
          (progress[i].last_ms - progress[i].first_ms) / (requests[i].output_tokens - 1);
    }
  }
  return out;
}

absl::Status CheckAllDone(const std::vector<Progress>& progress) {
  for (size_t i = 0; i < progress.size(); ++i) {
    if (!progress[i].done) {
      return absl::InternalError(absl::StrCat("simulation ended with request ", i, " unfinished"));
    }
  }
  return absl::OkStatus();
}

template <typename Unit, typename Load>
int LeastLoaded(const std::vector<Unit>& units, Load load) {
  int best = 0;
  for (int u = 1; u < static_cast<int>(units.size()); ++u) {
    if (load(units[u]) < load(units[best])) best = u;
  }
  return best;
}

}  // namespace

absl::StatusOr<std::vector<Request>> MakePoissonWorkload(const WorkloadSpec& spec) {
  if (!(spec.rate_per_s > 0) || !(spec.duration_s > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("workload needs rate and duration > 0, got ",
                                                   spec.rate_per_s, " req/s, ", spec.duration_s,
                                                   " s"));
  }
  for (const LengthRange& r : {spec.input, spec.output}) {
    if (r.lo < 1 || r.hi < r.lo) {
      return absl::InvalidArgumentError(
          absl::StrCat("length range needs 1 <= lo <= hi, got ", r.lo, "-", r.hi));
    }
  }
  std::mt19937_64 rng(spec.seed);
  std::exponential_distribution<double> gap(1.0);
  std::uniform_int_distribution<int> input(spec.input.lo, spec.input.hi);
  std::uniform_int_distribution<int> output(spec.output.lo, spec.output.hi);
  std::vector<Request> requests;
  double t_ms = 0;
  while (true) {
    t_ms += 1e3 * gap(rng) / spec.rate_per_s;
    if (t_ms > 1e3 * spec.duration_s) break;
    Request r;
    r.arrival_ms = t_ms;
    r.prompt_tokens = input(rng);
    r.output_tokens = output(rng);
    requests.push_back(r);
  }
  return requests;
}

absl::StatusOr<std::vector<Outcome>> SimulateColocated(const ColocatedSpec& spec,
                                                       const std::vector<Request>& requests) {
  if (spec.units < 1 || !(spec.first_token_latency_ms >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("colocated needs units >= 1 and first_token_latency_ms >= 0, got ", spec.units,
                     ", ", spec.first_token_latency_ms));
  }
  if (absl::Status s = CheckInputs(requests, spec.limits); !s.ok()) return s;
  struct Unit {
    std::deque<int> waiting;   // prompt not fully computed, oldest first
    std::vector<int> running;  // decoding
    std::vector<int> step_decodes;
    std::vector<Chunk> step_chunks;
    bool busy = false;
    int outstanding = 0;
  };
  std::vector<Unit> units(spec.units);
  std::vector<Progress> progress(requests.size());
  EventQueue events;
  for (size_t i = 0; i < requests.size(); ++i) {
    events.Push(requests[i].arrival_ms, EventKind::kArrival, 0, static_cast<int>(i));
  }
  auto start_step = [&](int u, double now) {
    Unit& unit = units[u];
    unit.step_decodes = unit.running;
    unit.step_chunks.clear();
    int started = 0;
    for (int id : unit.waiting) started += progress[id].prefilled > 0 ? 1 : 0;
    const int64_t prefill_tokens =
        TakeChunks(unit.waiting, requests, progress,
                   spec.limits.max_batch_tokens - static_cast<int64_t>(unit.step_decodes.size()),
                   spec.limits.max_running - static_cast<int>(unit.running.size()) - started,
                   unit.step_chunks);
    if (unit.step_decodes.empty() && unit.step_chunks.empty()) {
      unit.busy = false;
      return;
    }
    unit.busy = true;
    const double ms = StepMs(spec.costs, prefill_tokens, static_cast<int>(unit.step_decodes.size()),
                             ContextTokens(unit.step_decodes, requests, progress));
    events.Push(now + ms, EventKind::kStepDone, u, 0);
  };
  auto finish = [&](Unit& unit, int id) {
    progress[id].done = true;
    --unit.outstanding;
  };
  auto step_done = [&](int u, double now) {
    Unit& unit = units[u];
    unit.busy = false;
    for (int id : unit.step_decodes) {
      Progress& p = progress[id];
      ++p.generated;
      p.last_ms = now;
      if (p.generated == requests[id].output_tokens) {
        unit.running.erase(std::find(unit.running.begin(), unit.running.end(), id));
        finish(unit, id);
      }
    }
    for (const Chunk& c : unit.step_chunks) {
      Progress& p = progress[c.request];
      p.prefilled += c.tokens;
      if (p.prefilled < requests[c.request].prompt_tokens) continue;
      unit.waiting.erase(std::find(unit.waiting.begin(), unit.waiting.end(), c.request));
      p.first_ms = p.last_ms = now;
      p.generated = 1;
      if (requests[c.request].output_tokens == 1) {
        finish(unit, c.request);
      } else {
        unit.running.push_back(c.request);
      }
    }
  };
  std::vector<int> to_start;  // units that may have work, started once the instant is over
  while (!events.Empty()) {
    const Event e = events.Pop();
    if (e.kind == EventKind::kArrival) {
      const int u = LeastLoaded(units, [](const Unit& x) { return x.outstanding; });
      units[u].waiting.push_back(e.request);
      ++units[u].outstanding;
      to_start.push_back(u);
    } else {
      step_done(e.unit, e.t);
      to_start.push_back(e.unit);
    }
    // Every event of an instant is in before an idle unit starts its next step.
    if (events.Empty() || events.NextTime() > e.t) {
      for (int u : to_start) {
        if (!units[u].busy) start_step(u, e.t);
      }
      to_start.clear();
    }
  }
  if (absl::Status s = CheckAllDone(progress); !s.ok()) return s;
  return Outcomes(requests, progress, spec.first_token_latency_ms);
}

absl::StatusOr<std::vector<Outcome>> SimulateDisagg(const DisaggSpec& spec,
                                                    const std::vector<Request>& requests) {
  if (spec.prefill_units < 1 || spec.decode_units < 1 || !(spec.first_token_latency_ms >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "xPyD needs x, y >= 1 and first_token_latency_ms >= 0, got ", spec.prefill_units, "P",
        spec.decode_units, "D, ", spec.first_token_latency_ms));
  }
  if (!(spec.transfer.bytes_per_s > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("transfer bytes_per_s must be > 0, got ", spec.transfer.bytes_per_s));
  }
  if (absl::Status s = CheckInputs(requests, spec.limits); !s.ok()) return s;
  struct PrefillUnit {
    std::deque<int> queue;
    std::vector<Chunk> pass;
    int64_t queued_tokens = 0;  // prompt tokens not computed yet
    bool busy = false;
  };
  struct DecodeUnit {
    std::deque<int> landed;  // K/V here, not yet in the batch
    std::vector<int> running;
    std::vector<int> step;
    int assigned = 0;  // routed here and not finished
    bool busy = false;
  };
  std::vector<PrefillUnit> prefill(spec.prefill_units);
  std::vector<DecodeUnit> decode(spec.decode_units);
  std::vector<int> decode_of(requests.size(), 0);
  std::vector<Progress> progress(requests.size());
  EventQueue events;
  // A step-done event's unit: the prefill unit's index, or prefill_units + the decode unit's.
  for (size_t i = 0; i < requests.size(); ++i) {
    events.Push(requests[i].arrival_ms, EventKind::kArrival, 0, static_cast<int>(i));
  }
  auto start_pass = [&](int u, double now) {
    PrefillUnit& unit = prefill[u];
    unit.pass.clear();
    const int64_t tokens = TakeChunks(unit.queue, requests, progress, spec.limits.max_batch_tokens,
                                      spec.limits.max_batch_tokens, unit.pass);
    unit.busy = tokens > 0;
    if (unit.busy)
      events.Push(now + PrefillMs(spec.prefill_costs, tokens), EventKind::kStepDone, u, 0);
  };
  auto start_step = [&](int u, double now) {
    DecodeUnit& unit = decode[u];
    while (!unit.landed.empty() &&
           static_cast<int>(unit.running.size()) < spec.limits.max_running) {
      unit.running.push_back(unit.landed.front());
      unit.landed.pop_front();
    }
    unit.step = unit.running;
    unit.busy = !unit.step.empty();
    if (!unit.busy) return;
    const double ms = DecodeMs(spec.decode_costs, static_cast<int>(unit.step.size()),
                               ContextTokens(unit.step, requests, progress));
    events.Push(now + ms, EventKind::kStepDone, spec.prefill_units + u, 0);
  };
  auto finish = [&](int id) {
    progress[id].done = true;
    --decode[decode_of[id]].assigned;
  };
  auto pass_done = [&](int u, double now) {
    PrefillUnit& unit = prefill[u];
    unit.busy = false;
    for (const Chunk& c : unit.pass) {
      Progress& p = progress[c.request];
      p.prefilled += c.tokens;
      unit.queued_tokens -= c.tokens;
      if (p.prefilled < requests[c.request].prompt_tokens) continue;
      unit.queue.erase(std::find(unit.queue.begin(), unit.queue.end(), c.request));
      p.first_ms = p.last_ms = now;
      p.generated = 1;
      if (requests[c.request].output_tokens == 1) {
        finish(c.request);
      } else {
        events.Push(now + TransferMs(spec.transfer, requests[c.request].prompt_tokens),
                    EventKind::kKvLanded, decode_of[c.request], c.request);
      }
    }
  };
  auto step_done = [&](int u, double now) {
    DecodeUnit& unit = decode[u];
    unit.busy = false;
    for (int id : unit.step) {
      Progress& p = progress[id];
      ++p.generated;
      p.last_ms = now;
      if (p.generated == requests[id].output_tokens) {
        unit.running.erase(std::find(unit.running.begin(), unit.running.end(), id));
        finish(id);
      }
    }
  };
  const int num_prefill = spec.prefill_units;
  std::vector<int> to_start;  // as the step-done events' units; started once the instant is over
  while (!events.Empty()) {
    const Event e = events.Pop();
    switch (e.kind) {
      case EventKind::kArrival: {
        const int p = LeastLoaded(prefill, [](const PrefillUnit& x) { return x.queued_tokens; });
        const int d = LeastLoaded(decode, [](const DecodeUnit& x) { return x.assigned; });
        decode_of[e.request] = d;
        ++decode[d].assigned;
        prefill[p].queue.push_back(e.request);
        prefill[p].queued_tokens += requests[e.request].prompt_tokens;
        to_start.push_back(p);
        break;
      }
      case EventKind::kKvLanded:
        decode[e.unit].landed.push_back(e.request);
        to_start.push_back(num_prefill + e.unit);
        break;
      case EventKind::kStepDone:
        if (e.unit < num_prefill) {
          pass_done(e.unit, e.t);
        } else {
          step_done(e.unit - num_prefill, e.t);
        }
        to_start.push_back(e.unit);
        break;
    }
    // Every event of an instant is in before an idle unit starts its next pass.
    if (events.Empty() || events.NextTime() > e.t) {
      for (int u : to_start) {
        if (u < num_prefill) {
          if (!prefill[u].busy) start_pass(u, e.t);
        } else if (!decode[u - num_prefill].busy) {
          start_step(u - num_prefill, e.t);
        }
      }
      to_start.clear();
    }
  }
  if (absl::Status s = CheckAllDone(progress); !s.ok()) return s;
  return Outcomes(requests, progress, spec.first_token_latency_ms);
}

Attainment Judge(const std::vector<Outcome>& outcomes, const Slo& slo) {
  Attainment a;
  if (outcomes.empty()) return a;
  int both = 0, ttft = 0, tpot = 0;
  for (const Outcome& o : outcomes) {
    const bool t1 = o.ttft_ms <= slo.ttft_ms, t2 = o.tpot_ms <= slo.tpot_ms;
    ttft += t1;
    tpot += t2;
    both += t1 && t2;
  }
  const double n = static_cast<double>(outcomes.size());
  a.both = both / n;
  a.ttft = ttft / n;
  a.tpot = tpot / n;
  return a;
}

}  // namespace duet::goodput_sim
