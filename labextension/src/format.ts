/**
 * Formatting of sizes, times and percentages, the way the whole UI writes them.
 *
 * Pure functions: no DOM, so that they are unit-tested without a browser.
 */

import { __, _n } from './i18n';

const GiB = 1024 ** 3;
const MiB = 1024 ** 2;

/** Up to `digits` decimals, without trailing zeros: 2.50 -> "2.5", 40.0 -> "40". */
export function trimNumber(value: number, digits = 1): string {
  const fixed = value.toFixed(digits);
  return fixed.includes('.') ? fixed.replace(/\.?0+$/, '') : fixed;
}

/** A size in binary units: "10 GiB", "512 MiB", "1.5 GiB", "0 GiB". */
export function formatBytes(bytes: number | null | undefined): string {
  if (bytes === null || bytes === undefined || !isFinite(bytes)) {
    return '–';
  }
  if (bytes === 0) {
    return '0 GiB';
  }
  if (Math.abs(bytes) >= GiB) {
    return `${trimNumber(bytes / GiB)} GiB`;
  }
  if (Math.abs(bytes) >= MiB) {
    return `${trimNumber(bytes / MiB, 0)} MiB`;
  }
  return `${trimNumber(bytes / 1024, 0)} KiB`;
}

/**
 * "used / limit GiB" in the limit's unit, as jupyter-resource-usage writes it: "10 / 40 GiB".
 * Without a limit: "10 GiB".
 */
export function formatUsedOf(used: number, limit: number | null | undefined): string {
  if (limit === null || limit === undefined) {
    return formatBytes(used);
  }
  const unit = limit >= GiB || limit === 0 ? GiB : MiB;
  const name = unit === GiB ? 'GiB' : 'MiB';
  return `${trimNumber(used / unit)} / ${trimNumber(limit / unit)} ${name}`;
}

/** A utilization percentage: "37%"; null (no reading) -> "–". */
export function formatPercent(value: number | null | undefined): string {
  if (value === null || value === undefined || !isFinite(value)) {
    return '–';
  }
  return `${Math.round(value)}%`;
}

/** GPU-hours: "6.2 h", "10 h". */
export function formatHours(hours: number): string {
  return __('%1 h', trimNumber(hours));
}

/** A duration for sentences: "45 s", "28 min", "1 h 5 min", "2 d 3 h". */
export function formatDuration(seconds: number): string {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) {
    return __('%1 s', s);
  }
  const minutes = Math.floor(s / 60);
  if (minutes < 60) {
    return __('%1 min', minutes);
  }
  const hours = Math.floor(minutes / 60);
  if (hours < 24) {
    const rest = minutes % 60;
    return rest ? __('%1 h %2 min', hours, rest) : __('%1 h', hours);
  }
  const days = Math.floor(hours / 24);
  const rest = hours % 24;
  return rest ? __('%1 d %2 h', days, rest) : __('%1 d', days);
}

/** A ticking countdown: "0:09", "4:05", "1:02:03"; never negative. */
export function formatCountdown(seconds: number): string {
  const s = Math.max(0, Math.ceil(seconds));
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const sec = s % 60;
  const pad = (n: number) => String(n).padStart(2, '0');
  return h > 0 ? `${h}:${pad(m)}:${pad(sec)}` : `${m}:${pad(sec)}`;
}

/** A wall-clock time of day, "14:05", in the browser's time zone. */
export function formatClock(unixSeconds: number): string {
  const d = new Date(unixSeconds * 1000);
  const pad = (n: number) => String(n).padStart(2, '0');
  return `${pad(d.getHours())}:${pad(d.getMinutes())}`;
}

/**
 * A time the user reads beside `now`: "19:25" on the same day, "Nov 25 19:25" on another (a time
 * of day alone, for a deadline days away, looks past).
 */
export function formatWhen(unixSeconds: number, now: number): string {
  const d = new Date(unixSeconds * 1000);
  if (d.toDateString() === new Date(now * 1000).toDateString()) {
    return formatClock(unixSeconds);
  }
  const day = d.toLocaleDateString(undefined, { month: 'short', day: 'numeric' });
  return `${day} ${formatClock(unixSeconds)}`;
}

/** Seconds before a deadline from which its time is said with its seconds. */
export const SECONDS_SHOWN_WITHIN = 120;

/**
 * A deadline as a sentence says it: "14:05" (with its date on another day), "14:05:09" when it is
 * under two minutes away ("at 21:10" for 21:10:55, a minute away, read as already past).
 */
export function formatDeadline(unixSeconds: number, now: number): string {
  const left = unixSeconds - now;
  return left > 0 && left < SECONDS_SHOWN_WITHIN
    ? formatClockSeconds(unixSeconds)
    : formatWhen(unixSeconds, now);
}

/**
 * The pool's note in words a user understands: NVML's own error text ("NVML unavailable: NVML
 * Shared Library Not Found") says that this machine has no NVIDIA driver; the admin finds the
 * library's words in the server log and `jupyter gpu-pool status`.
 */
export function plainNote(note: string): string {
  return note
    .replace(/no GPU detected by NVML \(NVML unavailable: [^()]*(\([^()]*\)[^()]*)*\)/g, () =>
      __('no NVIDIA driver found on this machine')
    )
    .replace(/NVML unavailable: [^;)]*/g, () => __('no NVIDIA driver found on this machine'))
    .replace(/no GPU detected by NVML \(none found\)/g, () => __('no NVIDIA GPU found'));
}

/** A slice as the server writes it ("10GiB", "20GiB,50%") as the UI writes sizes: "10 GiB", "20 GiB · 50%". */
export function sliceWords(text: string): string {
  return text
    .replace(/(\d)\s*([KMGT]i?B)\b/g, '$1 $2')
    .split(',')
    .map(part => part.trim())
    .join(' · ');
}

/** A time of day with seconds, for tables of what happened: "14:05:09". */
export function formatClockSeconds(unixSeconds: number): string {
  const d = new Date(unixSeconds * 1000);
  return `${formatClock(unixSeconds)}:${String(d.getSeconds()).padStart(2, '0')}`;
}

/** How long ago, for lists of past events: "just now", "3 min ago". */
export function formatAgo(now: number, then: number): string {
  const s = now - then;
  if (s < 10) {
    return __('just now');
  }
  return __('%1 ago', formatDuration(s));
}

/**
 * The notebook's file name without its folders: "analysis/Untitled.ipynb" -> "Untitled.ipynb"; ""
 * where the path names no file (a kernel started over the REST API, without a notebook, is ".").
 */
export function baseName(path: string): string {
  const parts = path.split('/').filter(Boolean);
  const last = parts.length ? parts[parts.length - 1] : path;
  return /[\p{L}\p{N}]/u.test(last) ? last : '';
}

/**
 * A kernel as the UI names it: its notebook, else "kernel 0b6f5f0e" (its id, short); `atStart`: it
 * starts a sentence ("Kernel 0b6f5f0e: …"; a notebook's name is written as it is).
 */
export function kernelName(
  path: string | null | undefined,
  kernelId: string,
  atStart = false
): string {
  const id = kernelId.slice(0, 8);
  return baseName(path ?? '') || (atStart ? __('Kernel %1', id) : __('kernel %1', id));
}

/** The short name of a GPU from its label: "GPU 0 · Demo GPU · 40 GiB (declared)" -> "GPU 0". */
export function gpuShortName(label: string): string {
  return label.split(' · ')[0];
}

/**
 * Points of an SVG polyline for a sparkline of [time, percent] samples, x by time and y by
 * percent (top = 100). The x axis spans the samples of the last `windowSeconds` (at most) and
 * at least `minSpan` seconds, ending at `now`: a young kernel's few samples use the width
 * instead of crowding at its right edge. Samples without a reading are left out.
 */
export function sparklinePoints(
  samples: ReadonlyArray<readonly [number, number | null]>,
  now: number,
  windowSeconds: number,
  width: number,
  height: number,
  minSpan = 60
): string {
  const recent = samples.filter(
    (s): s is readonly [number, number] =>
      s[0] >= now - windowSeconds && s[0] <= now && s[1] !== null
  );
  if (!recent.length) {
    return '';
  }
  const oldest = Math.min(...recent.map(([t]) => t));
  const span = Math.min(windowSeconds, Math.max(minSpan, now - oldest));
  const start = now - span;
  const clamp = (v: number, lo: number, hi: number) => Math.min(hi, Math.max(lo, v));
  return recent
    .filter(([t]) => t >= start)
    .map(([t, p]) => {
      const x = ((t - start) / span) * width;
      const y = height - (clamp(p, 0, 100) / 100) * height;
      return `${trimNumber(x, 1)},${trimNumber(y, 1)}`;
    })
    .join(' ');
}

/** "1 kernel", "2 kernels". */
export function kernelsText(n: number): string {
  return _n('%1 kernel', '%1 kernels', n);
}
