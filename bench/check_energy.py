#!/usr/bin/env python3
"""Checks `layup bench --energy` against a reading taken outside the process.

Runs the given `layup bench ... --energy --json FILE` command while this script polls the same
GPU's NVML counters on its own (through ctypes, no code shared with layup): the total-energy
counter and the power draw, every few milliseconds, with wall-clock times. layup's JSON says over
which wall-clock interval it read the counter; this script interpolates its own counter samples
to that interval and compares, and integrates its power samples over it as a second, different
method. It also reads the idle power before the run, for the plausibility check (mean power
between idle and the card's limit).

    python3 bench/check_energy.py --json run.json --out check.json -- \\
        build/layup bench gpt2 --batch 32 --steps 50 --energy --json run.json

Exits 1 when the counters disagree by more than --tolerance (relative) or the power is not
plausible; prints a markdown line either way.
"""
import argparse
import bisect
import ctypes
import json
import subprocess
import sys
import threading
import time


class Nvml:
    """The few NVML calls this check needs, declared here (NVML's C API, by its documented names)."""

    def __init__(self, index):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        self._check(self.lib.nvmlInit_v2(), "nvmlInit_v2")
        self.device = ctypes.c_void_p()
        self._check(self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self.device)),
                    "nvmlDeviceGetHandleByIndex_v2")

    @staticmethod
    def _check(result, what):
        if result != 0:
            raise RuntimeError(f"{what} failed with NVML error {result}")

    def energy_joules(self):
        millijoules = ctypes.c_ulonglong()
        self._check(self.lib.nvmlDeviceGetTotalEnergyConsumption(self.device,
                                                                 ctypes.byref(millijoules)),
                    "nvmlDeviceGetTotalEnergyConsumption")
        return millijoules.value / 1e3

    def power_watts(self):
        milliwatts = ctypes.c_uint()
        self._check(self.lib.nvmlDeviceGetPowerUsage(self.device, ctypes.byref(milliwatts)),
                    "nvmlDeviceGetPowerUsage")
        return milliwatts.value / 1e3

    def power_limit_watts(self):
        milliwatts = ctypes.c_uint()
        self._check(self.lib.nvmlDeviceGetEnforcedPowerLimit(self.device,
                                                              ctypes.byref(milliwatts)),
                    "nvmlDeviceGetEnforcedPowerLimit")
        return milliwatts.value / 1e3


def poll(nvml, period_s, samples, stop):
    while not stop.is_set():
        samples.append((time.time(), nvml.energy_joules(), nvml.power_watts()))
        time.sleep(period_s)


def interpolate(times, values, at):
    """values at time `at`, linear between the two samples around it."""
    i = bisect.bisect_left(times, at)
    if i == 0 or i == len(times):
        raise RuntimeError(f"no samples around t={at:.3f}: the poller did not cover the interval")
    t0, t1 = times[i - 1], times[i]
    return values[i - 1] + (values[i] - values[i - 1]) * (at - t0) / (t1 - t0)


def integrate_power(samples, start, stop):
    """Trapezoid rule over the power samples inside [start, stop], ends interpolated."""
    times = [s[0] for s in samples]
    watts = [s[2] for s in samples]
    points = [(start, interpolate(times, watts, start))]
    points += [(t, w) for t, w in zip(times, watts) if start < t < stop]
    points.append((stop, interpolate(times, watts, stop)))
    return sum(0.5 * (w0 + w1) * (t1 - t0) for (t0, w0), (t1, w1) in zip(points, points[1:]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", required=True, help="the JSON file the layup command writes")
    parser.add_argument("--out", help="write the comparison here as JSON")
    parser.add_argument("--gpu-index", type=int, default=0, help="NVML's index of the GPU")
    parser.add_argument("--period-ms", type=float, default=5.0, help="this script's poll period")
    parser.add_argument("--idle-s", type=float, default=2.0, help="seconds of idle power first")
    parser.add_argument("--tolerance", type=float, default=0.02,
                        help="largest relative difference of the two counter readings")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the layup command")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the layup command after --")

    nvml = Nvml(args.gpu_index)
    idle = []
    deadline = time.time() + args.idle_s
    while time.time() < deadline:
        idle.append(nvml.power_watts())
        time.sleep(0.05)
    idle_watts = min(idle)

    samples, stop = [], threading.Event()
    poller = threading.Thread(target=poll, args=(nvml, args.period_ms / 1e3, samples, stop))
    poller.start()
    try:
        result = subprocess.run(command)
    finally:
        time.sleep(0.2)  # samples after layup's interval ends, for the interpolation
        stop.set()
        poller.join()
    if result.returncode != 0:
        print(f"the layup command failed with exit {result.returncode}", file=sys.stderr)
        return 1

    with open(args.json) as file:
        run = json.load(file)
    gpu = [r for r in run.get("energy") or [] if r["source"].startswith("gpu")]
    if not gpu or not gpu[0]["available"]:
        print(f"layup read no GPU energy: {gpu}", file=sys.stderr)
        return 1
    layup = gpu[0]
    start, end = layup["interval_unix_seconds"]
    times = [s[0] for s in samples]
    counter = interpolate(times, [s[1] for s in samples], end) - interpolate(
        times, [s[1] for s in samples], start)
    power_integral = integrate_power(samples, start, end)
    limit = nvml.power_limit_watts()
    mean_watts = layup["joules"] / (end - start)
    difference = abs(layup["joules"] - counter) / counter
    plausible = idle_watts < mean_watts <= limit
    agrees = difference <= args.tolerance
    comparison = {
        "command": command,
        "interval_s": end - start,
        "layup_joules": layup["joules"],
        "layup_method": layup["method"],
        "independent_counter_joules": counter,
        "independent_power_integral_joules": power_integral,
        "relative_difference": difference,
        "tolerance": args.tolerance,
        "mean_watts": mean_watts,
        "idle_watts": idle_watts,
        "power_limit_watts": limit,
        "samples": len(samples),
        "agrees": agrees,
        "plausible": plausible,
    }
    if args.out:
        with open(args.out, "w") as file:
            json.dump(comparison, file, indent=2)
    print(f"| {end - start:.2f} s | layup {layup['joules']:.1f} J | same counter read here "
          f"{counter:.1f} J ({100 * difference:.2f}% apart) | power sampled here "
          f"{power_integral:.1f} J | mean {mean_watts:.0f} W (idle {idle_watts:.0f} W, limit "
          f"{limit:.0f} W) | {'agrees' if agrees else 'DISAGREES'}, "
          f"{'plausible' if plausible else 'NOT plausible'} |")
    return 0 if agrees and plausible else 1


if __name__ == "__main__":
    sys.exit(main())
