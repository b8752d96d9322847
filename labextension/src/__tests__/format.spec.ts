import assert from 'node:assert/strict';

import {
  baseName,
  kernelName,
  formatAgo,
  formatBytes,
  formatClock,
  formatCountdown,
  formatDuration,
  formatClockSeconds,
  formatHours,
  formatPercent,
  plainNote,
  sliceWords,
  formatUsedOf,
  gpuShortName,
  kernelsText,
  sparklinePoints,
  trimNumber,
  formatDeadline
} from '../format';
import { reasonPhrase } from '../words';

const GiB = 1024 ** 3;
const MiB = 1024 ** 2;

describe('formatDeadline', () => {
  it('says a deadline to the minute, with its seconds when under two minutes away', () => {
    const at = Date.UTC(2024, 10, 22, 21, 10, 55) / 1000;
    assert.equal(formatDeadline(at, at - 30), '21:10:55'); // "at 21:10" would read as past
    assert.equal(formatDeadline(at, at - 119), '21:10:55');
    assert.equal(formatDeadline(at, at - 120), '21:10');
    assert.equal(formatDeadline(at, at - 3600), '21:10');
    assert.equal(formatDeadline(at, at + 5), '21:10'); // past: as any time
    assert.match(formatDeadline(at, at - 3 * 86400), /^\S+ \d+ 21:10$/);
  });
});

describe('formatBytes', () => {
  it('writes GiB with at most one decimal and no trailing zero', () => {
    assert.equal(formatBytes(10 * GiB), '10 GiB');
    assert.equal(formatBytes(1.5 * GiB), '1.5 GiB');
    assert.equal(formatBytes(80 * GiB), '80 GiB');
    assert.equal(formatBytes(2.04 * GiB), '2 GiB');
  });
  it('writes MiB below a GiB and 0 as 0 GiB', () => {
    assert.equal(formatBytes(512 * MiB), '512 MiB');
    assert.equal(formatBytes(0), '0 GiB');
  });
  it('writes a dash where there is no reading', () => {
    assert.equal(formatBytes(null), '–');
    assert.equal(formatBytes(undefined), '–');
  });
});

describe('formatUsedOf', () => {
  it('writes "used / limit" in the limit’s unit, as jupyter-resource-usage does', () => {
    assert.equal(formatUsedOf(10 * GiB, 40 * GiB), '10 / 40 GiB');
    assert.equal(formatUsedOf(0, 40 * GiB), '0 / 40 GiB');
    assert.equal(formatUsedOf(2.5 * GiB, 40 * GiB), '2.5 / 40 GiB');
    assert.equal(formatUsedOf(256 * MiB, 512 * MiB), '256 / 512 MiB');
  });
  it('writes only the use without a limit', () => {
    assert.equal(formatUsedOf(10 * GiB, null), '10 GiB');
  });
});

describe('durations and times', () => {
  it('formatDuration picks the unit a person would say', () => {
    assert.equal(formatDuration(0), '0 s');
    assert.equal(formatDuration(45), '45 s');
    assert.equal(formatDuration(28 * 60 + 10), '28 min');
    assert.equal(formatDuration(3600), '1 h');
    assert.equal(formatDuration(3900), '1 h 5 min');
    assert.equal(formatDuration(2 * 86400 + 3 * 3600), '2 d 3 h');
    assert.equal(formatDuration(-5), '0 s');
  });
  it('formatCountdown ticks down in m:ss and never goes negative', () => {
    assert.equal(formatCountdown(9), '0:09');
    assert.equal(formatCountdown(245), '4:05');
    assert.equal(formatCountdown(3723), '1:02:03');
    assert.equal(formatCountdown(8.2), '0:09');
    assert.equal(formatCountdown(-3), '0:00');
  });
  it('formatClock writes hours and minutes; tables add the seconds', () => {
    // The test script runs with TZ=UTC.
    assert.equal(formatClock(Date.UTC(2024, 10, 22, 14, 5, 59) / 1000), '14:05');
    assert.equal(formatClockSeconds(Date.UTC(2024, 10, 22, 14, 5, 9) / 1000), '14:05:09');
  });
  it('formatAgo', () => {
    assert.equal(formatAgo(1000, 995), 'just now');
    assert.equal(formatAgo(1000, 1000 - 180), '3 min ago');
  });
});

describe('small words', () => {
  it('formatPercent rounds and writes a dash for no reading', () => {
    assert.equal(formatPercent(37.4), '37%');
    assert.equal(formatPercent(null), '–');
  });
  it('counts kernels in the right number', () => {
    assert.equal(kernelsText(1), '1 kernel');
    assert.equal(kernelsText(0), '0 kernels');
  });
  it('formatHours keeps one decimal of GPU time', () => {
    assert.equal(formatHours(6.24), '6.2 h');
    assert.equal(formatHours(10), '10 h');
  });
  it('gpuShortName keeps the GPU’s index from its label', () => {
    assert.equal(gpuShortName('GPU 0 · Demo GPU · 40 GiB (declared)'), 'GPU 0');
  });
  it('reasonPhrase says why in a few words, an unknown reason readably', () => {
    assert.equal(reasonPhrase('gpu_idle'), 'GPU memory held, GPU unused');
    assert.equal(reasonPhrase('pool_exhausted'), 'no GPU has room for it');
    assert.equal(reasonPhrase('admin'), 'an admin asked');
    assert.equal(reasonPhrase('pressure'), 'someone is waiting for a GPU slice');
    assert.equal(reasonPhrase('new_reason'), 'the pool’s policy (new reason)');
    assert.equal(reasonPhrase(undefined), 'the pool’s policy');
  });
  it('baseName keeps the notebook’s file name', () => {
    assert.equal(baseName('analysis/Untitled.ipynb'), 'Untitled.ipynb');
    // A kernel started over the REST API has no notebook: its "name" "." names nothing.
    assert.equal(baseName('.'), '');
    assert.equal(baseName('/'), '');
    assert.equal(kernelName('.', '0b6f5f0e-1111'), 'kernel 0b6f5f0e');
    assert.equal(kernelName('a/b.ipynb', '0b6f5f0e-1111'), 'b.ipynb');
    // at a sentence's start (the status bar's tooltip), the id's word has its capital; a file name is as it is
    assert.equal(kernelName('', '0b6f5f0e-1111', true), 'Kernel 0b6f5f0e');
    assert.equal(kernelName('a/b.ipynb', '0b6f5f0e-1111', true), 'b.ipynb');
    assert.equal(baseName('a.ipynb'), 'a.ipynb');
  });
  it('trimNumber', () => {
    assert.equal(trimNumber(40), '40');
    assert.equal(trimNumber(2.5), '2.5');
    assert.equal(trimNumber(2.04), '2');
  });
});

describe('sparklinePoints', () => {
  it('maps time to x over the window and percent to y (100% at the top)', () => {
    const points = sparklinePoints(
      [
        [700, 0],
        [850, 50],
        [1000, 100]
      ],
      1000,
      300,
      100,
      24
    );
    assert.equal(points, '0,24 50,12 100,0');
  });
  it('drops samples outside the window and clamps percentages', () => {
    const points = sparklinePoints(
      [
        [100, 50],
        [1000, 150]
      ],
      1000,
      300,
      100,
      24
    );
    assert.equal(points, '100,0');
  });
  it('spreads a young kernel’s samples over the width (at least a minute), not at the right edge', () => {
    // 30 s of samples: the axis spans the minimum 60 s.
    assert.equal(
      sparklinePoints(
        [
          [970, 0],
          [1000, 100]
        ],
        1000,
        300,
        100,
        24
      ),
      '50,24 100,0'
    );
    // 2 min of samples: the axis spans them.
    assert.equal(
      sparklinePoints(
        [
          [880, 0],
          [940, 50],
          [1000, 100]
        ],
        1000,
        300,
        100,
        24
      ),
      '0,24 50,12 100,0'
    );
    assert.equal(sparklinePoints([], 1000, 300, 100, 24), '');
  });
  it('leaves samples without a reading out', () => {
    assert.equal(
      sparklinePoints(
        [
          [700, 0],
          [850, null],
          [1000, 100]
        ],
        1000,
        300,
        100,
        24
      ),
      '0,24 100,0'
    );
  });
});

describe('sliceWords', () => {
  it('writes a slice as the UI writes sizes: a space before the unit, the SM share after a dot', () => {
    assert.equal(sliceWords('10GiB'), '10 GiB');
    assert.equal(sliceWords('20GiB,50%'), '20 GiB · 50%');
    assert.equal(sliceWords('512MiB'), '512 MiB');
    assert.equal(sliceWords('whole'), 'whole');
  });
});

describe('plainNote', () => {
  it('says NVML’s own error in words a user understands', () => {
    const note =
      '2 declared GPU(s) from the inventory (no GPU detected by NVML (NVML unavailable: NVML Shared Library Not Found))';
    assert.equal(
      plainNote(note),
      '2 declared GPU(s) from the inventory (no NVIDIA driver found on this machine)'
    );
    assert.equal(
      plainNote('NVML unavailable: NVML Shared Library Not Found'),
      'no NVIDIA driver found on this machine'
    );
    assert.doesNotMatch(plainNote(note), /NVML|Shared Library/);
    assert.equal(
      plainNote('2 GPU(s) detected by NVML (A100; driver 570)'),
      '2 GPU(s) detected by NVML (A100; driver 570)'
    );
  });
});
