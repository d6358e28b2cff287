// Energy over an interval (the timed steps of `layup bench`, a training run), from what the
// hardware counts: the GPU's total-energy counter through NVML (nvml_energy.h), or its power draw
// sampled and integrated where that counter is missing, and the CPU packages' RAPL counters
// through Linux powercap (rapl_energy.h).
//
// A source that cannot be read is reported unavailable, with the reason, and counts nothing: no
// figure is ever estimated. The meter polls every source on one background thread: power sources
// every kPowerSamplePeriod (the integral is the trapezoid rule over those samples), counters every
// kCounterPollPeriod, often enough that a counter that wraps (RAPL's does, at max_energy_range_uj)
// never wraps twice between two reads.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/run_choices.h"

namespace layup {

constexpr std::chrono::milliseconds kPowerSamplePeriod{20};
constexpr std::chrono::milliseconds kCounterPollPeriod{500};

// What one source measured over an interval.
struct EnergyReading {
  std::string source;  // "gpu (NVIDIA H200)", "cpu package-0", ...
  std::string method;  // how: "NVML total-energy counter", "RAPL powercap counter", ...
  bool available = false;
  std::string unavailable_reason;  // why not, when not available
  double joules = 0.0;
  double seconds = 0.0;            // the interval the source was read over
  double power_limit_watts = 0.0;  // the device's power limit where it reports one (else 0)
  // The interval in wall-clock time (seconds since the Unix epoch), so that a reader outside the
  // process can take the same counter over the same interval (bench/check_energy.py does).
  double started_unix_seconds = 0.0;
  double stopped_unix_seconds = 0.0;
  double mean_watts() const { return seconds > 0.0 ? joules / seconds : 0.0; }
};

// One thing that can be read: a cumulative energy counter, or an instantaneous power.
class EnergySource {
 public:
  enum class Kind { kCounter, kPower };
  virtual ~EnergySource() = default;
  virtual std::string name() const = 0;
  virtual std::string method() const = 0;
  virtual Kind kind() const = 0;
  // Empty when the source can be read; else why not, in words a user can act on.
  virtual std::string unavailable_reason() const = 0;
  // kCounter: the counter in joules; kPower: the power now in watts. Empty when this read failed.
  virtual std::optional<double> read() = 0;
  // kCounter: the value past which the counter starts again from 0 (0: it does not wrap).
  virtual double wrap_joules() const { return 0.0; }
  // The device's power limit in watts where it reports one, else 0 (a plausibility bound).
  virtual double power_limit_watts() const { return 0.0; }
};

// How often the meter reads each kind of source.
struct EnergyPollPeriods {
  std::chrono::milliseconds power = kPowerSamplePeriod;
  std::chrono::milliseconds counter = kCounterPollPeriod;
};

// Reads sources over one interval: start(), then stop() for one reading per source (snapshot()
// in between, as often as wanted). Calls out of that order throw layup::Error.
class EnergyMeter {
 public:
  explicit EnergyMeter(std::vector<std::unique_ptr<EnergySource>> sources,
                       EnergyPollPeriods periods = {});
  ~EnergyMeter();
  EnergyMeter(const EnergyMeter&) = delete;
  EnergyMeter& operator=(const EnergyMeter&) = delete;

  void start();
  // Every source read now: the energy since start() (the meter goes on).
  std::vector<EnergyReading> snapshot();
  // The same, and the meter stops.
  std::vector<EnergyReading> stop();

 private:
  using Clock = std::chrono::steady_clock;
  struct Track {
    std::unique_ptr<EnergySource> source;
    bool failed = false;  // a read failed during the interval: the reading is unavailable
    std::string failure;
    double joules = 0.0;
    double last_value = 0.0;  // last counter (J) or power (W) read
    Clock::time_point last_time;
    Clock::time_point next_poll;
  };
  void poll(Track& track, Clock::time_point now);
  std::vector<EnergyReading> read_all();  // with mutex_ held
  void poll_loop();
  void halt_poller();  // stops the poller thread and joins it

  const EnergyPollPeriods periods_;
  std::vector<Track> tracks_;
  Clock::time_point started_;
  double started_unix_seconds_ = 0.0;
  std::mutex mutex_;  // guards tracks_ between the poller and start/stop, and stopping_
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread poller_;
};

// Every source this machine offers for a run on `device` (cpu or cuda): the RAPL packages,
// and on cuda the GPU (by PCI bus id, as CUDA names it; empty: NVML's device 0). Sources that
// cannot be read are included, so the report says why.
std::vector<std::unique_ptr<EnergySource>> energy_sources_for(DeviceKind device,
                                                              const std::string& gpu_pci_bus_id);

// "gpu (NVIDIA H200): 2431.2 J, 812.4 W mean (NVML total-energy counter)" or
// "cpu package-0: unavailable (...)".
std::string describe_energy(const EnergyReading& reading);
// The same over `steps` steps of `tokens_per_step` tokens: joules per step and per token too.
std::string describe_energy(const EnergyReading& reading, int steps, long long tokens_per_step);
nlohmann::json energy_json(const EnergyReading& reading, int steps, long long tokens_per_step);

}  // namespace layup
