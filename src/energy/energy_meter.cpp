// EnergyMeter: one poller thread over every source; see energy_meter.h.
#include "energy/energy_meter.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <utility>

#include "core/error.h"
#include "energy/nvml_energy.h"
#include "energy/rapl_energy.h"

namespace layup {
namespace {

double unix_seconds_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

EnergyMeter::EnergyMeter(std::vector<std::unique_ptr<EnergySource>> sources,
                         EnergyPollPeriods periods)
    : periods_(periods) {
  for (auto& source : sources) {
    Track track;
    track.source = std::move(source);
    tracks_.push_back(std::move(track));
  }
}

EnergyMeter::~EnergyMeter() {
  if (poller_.joinable()) halt_poller();
}

void EnergyMeter::halt_poller() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  poller_.join();
}

void EnergyMeter::start() {
  LAYUP_CHECK(!poller_.joinable(), "the energy meter is already running; stop() it first");
  {
    std::lock_guard lock(mutex_);
    started_ = Clock::now();
    started_unix_seconds_ = unix_seconds_now();
    for (Track& track : tracks_) {
      track.failed = !track.source->unavailable_reason().empty();
      track.failure = track.source->unavailable_reason();
      track.joules = 0.0;
      if (track.failed) continue;
      const std::optional<double> value = track.source->read();
      if (!value) {
        track.failed = true;
        track.failure = "the first read failed";
        continue;
      }
      track.last_value = *value;
      track.last_time = Clock::now();
      track.next_poll = track.last_time;
    }
    stopping_ = false;
  }
  poller_ = std::thread([this] { poll_loop(); });
}

void EnergyMeter::poll(Track& track, Clock::time_point now) {
  if (track.failed) return;
  const std::optional<double> value = track.source->read();
  if (!value) {
    track.failed = true;
    track.failure = "a read failed during the interval";
    return;
  }
  const double seconds = std::chrono::duration<double>(now - track.last_time).count();
  if (track.source->kind() == EnergySource::Kind::kPower) {
    track.joules += 0.5 * (track.last_value + *value) * seconds;  // trapezoid rule
  } else {
    double delta = *value - track.last_value;
    // A counter that went down wrapped once (polled often enough never to wrap twice).
    if (delta < 0.0) delta += track.source->wrap_joules();
    if (delta < 0.0) {
      track.failed = true;
      track.failure = "the counter went backwards";
      return;
    }
    track.joules += delta;
  }
  track.last_value = *value;
  track.last_time = now;
}

void EnergyMeter::poll_loop() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    const Clock::time_point now = Clock::now();
    Clock::time_point next = now + periods_.counter;
    for (Track& track : tracks_) {
      if (track.failed) continue;
      if (now >= track.next_poll) {
        poll(track, now);
        track.next_poll =
            now + (track.source->kind() == EnergySource::Kind::kPower ? periods_.power
                                                                      : periods_.counter);
      }
      next = std::min(next, track.next_poll);
    }
    wake_.wait_until(lock, next, [&] { return stopping_; });
  }
}

std::vector<EnergyReading> EnergyMeter::read_all() {
  const Clock::time_point now = Clock::now();
  const double now_unix_seconds = unix_seconds_now();
  std::vector<EnergyReading> readings;
  for (Track& track : tracks_) {
    poll(track, now);  // the interval up to now
    EnergyReading reading;
    reading.source = track.source->name();
    reading.method = track.source->method();
    reading.available = !track.failed;
    reading.unavailable_reason = track.failed ? track.failure : "";
    reading.joules = track.failed ? 0.0 : track.joules;
    reading.seconds = std::chrono::duration<double>(now - started_).count();
    reading.power_limit_watts = track.source->power_limit_watts();
    reading.started_unix_seconds = started_unix_seconds_;
    reading.stopped_unix_seconds = now_unix_seconds;
    readings.push_back(std::move(reading));
  }
  return readings;
}

std::vector<EnergyReading> EnergyMeter::snapshot() {
  LAYUP_CHECK(poller_.joinable(), "the energy meter is not running; start() it first");
  std::lock_guard lock(mutex_);
  return read_all();
}

std::vector<EnergyReading> EnergyMeter::stop() {
  LAYUP_CHECK(poller_.joinable(), "the energy meter is not running; start() it first");
  halt_poller();
  std::lock_guard lock(mutex_);
  return read_all();
}

std::vector<std::unique_ptr<EnergySource>> energy_sources_for(DeviceKind device,
                                                              const std::string& gpu_pci_bus_id) {
  std::vector<std::unique_ptr<EnergySource>> sources;
  if (device == DeviceKind::kCuda) sources.push_back(make_nvml_gpu_source(gpu_pci_bus_id));
  for (auto& package : rapl_package_sources(kPowercapRoot)) sources.push_back(std::move(package));
  return sources;
}

std::string describe_energy(const EnergyReading& reading) {
  char line[512];
  if (!reading.available) {
    std::snprintf(line, sizeof line, "%s: unavailable (%s)", reading.source.c_str(),
                  reading.unavailable_reason.c_str());
  } else {
    std::snprintf(line, sizeof line, "%s: %.1f J, %.1f W mean (%s)", reading.source.c_str(),
                  reading.joules, reading.mean_watts(), reading.method.c_str());
  }
  return line;
}

std::string describe_energy(const EnergyReading& reading, int steps, long long tokens_per_step) {
  if (!reading.available || steps <= 0 || tokens_per_step <= 0) return describe_energy(reading);
  char line[512];
  const double per_step = reading.joules / steps;
  std::snprintf(line, sizeof line, "%s: %.2f J/step, %.3f mJ/token, %.1f W mean",
                reading.source.c_str(), per_step,
                1e3 * per_step / static_cast<double>(tokens_per_step), reading.mean_watts());
  std::string text = line;
  if (reading.power_limit_watts > 0.0) {
    std::snprintf(line, sizeof line, " (limit %.0f W)", reading.power_limit_watts);
    text += line;
  }
  return text + "; " + reading.method;
}

nlohmann::json energy_json(const EnergyReading& reading, int steps, long long tokens_per_step) {
  nlohmann::json json = {
      {"source", reading.source},
      {"method", reading.method},
      {"available", reading.available},
      {"seconds", reading.seconds},
      {"interval_unix_seconds", {reading.started_unix_seconds, reading.stopped_unix_seconds}}};
  if (!reading.available) {
    json["unavailable_reason"] = reading.unavailable_reason;
    return json;
  }
  json["joules"] = reading.joules;
  json["mean_watts"] = reading.mean_watts();
  if (reading.power_limit_watts > 0.0) json["power_limit_watts"] = reading.power_limit_watts;
  if (steps > 0) json["joules_per_step"] = reading.joules / steps;
  if (steps > 0 && tokens_per_step > 0)
    json["joules_per_token"] = reading.joules / steps / static_cast<double>(tokens_per_step);
  return json;
}

}  // namespace layup
