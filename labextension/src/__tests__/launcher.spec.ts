import assert from 'node:assert/strict';

import { annotateLauncher, profileTooltip } from '../launcher';
import { me, profiles } from './fixtures';

/** A launcher as JupyterLab renders it: one card per kernelspec, titled with its display name. */
function launcher(labels: string[]): HTMLElement {
  const root = document.createElement('div');
  root.className = 'jp-Launcher';
  for (const label of labels) {
    const card = document.createElement('div');
    card.className = 'jp-LauncherCard';
    card.title = label;
    card.innerHTML = `<div class="jp-LauncherCard-icon"></div><div class="jp-LauncherCard-label" title="${label}"><p>${label}</p></div>`;
    root.appendChild(card);
  }
  return root;
}

describe('profileTooltip', () => {
  it('explains an SM share as the GPU’s compute, enforced by MPS', () => {
    const [p] = profiles({});
    const mps = {
      ...p,
      slice_label: '20 GiB · 50%',
      sm_percent: 50,
      description: 'Half an H100 for training'
    };
    assert.equal(
      profileTooltip(mps, false),
      'Half an H100 for training\nA slice of 20 GiB of GPU memory and 50% of the GPU’s compute (its streaming multiprocessors), enforced by NVIDIA MPS.\nIt would not start right now (your quota, or no room in the pool): the GPU panel says why.'
    );
  });
  it('says when the GPUs are declared', () => {
    const [p] = profiles({ 'gpu-10g': true });
    assert.match(
      profileTooltip(p, true),
      /^GPU 10 GiB of a demo GPU\nA slice of 10 GiB of GPU memory; the GPU’s compute is shared\.\nDemo: the pool’s GPUs are declared, not real\./
    );
  });
});

describe('annotateLauncher', () => {
  it('gives GPU kernel cards the profile’s tooltip and "(demo)"; leaves other cards alone', () => {
    const root = launcher([
      'Python 3 (ipykernel)',
      'Python 3 · GPU 10 GiB',
      'Python 3 · GPU 20 GiB'
    ]);
    const state = me({
      pool: { enabled: true, declared: true, note: '', gpus: 2 },
      profiles: profiles({ 'gpu-10g': true })
    });
    annotateLauncher(root, state);
    annotateLauncher(root, state); // idempotent: one "(demo)" per card
    const cards = Array.from(root.querySelectorAll<HTMLElement>('.jp-LauncherCard'));
    assert.equal(cards[0].title, 'Python 3 (ipykernel)');
    assert.equal(cards[0].querySelector('.jp-GpuPool-launcherDemo'), null);
    assert.match(cards[1].title, /^GPU 10 GiB of a demo GPU\n/);
    assert.deepEqual(
      cards.map(c => c.querySelectorAll('.jp-GpuPool-launcherDemo').length),
      [0, 1, 1]
    );
    assert.equal(cards[2].querySelector('.jp-GpuPool-launcherDemo')!.textContent, '(demo)');
  });
  it('marks nothing as a demo on real GPUs', () => {
    const root = launcher(['Python 3 · GPU 10 GiB']);
    annotateLauncher(
      root,
      me({ pool: { enabled: true, declared: false, note: '' }, profiles: profiles({}) })
    );
    assert.equal(root.querySelector('.jp-GpuPool-launcherDemo'), null);
    assert.match(
      root.querySelector<HTMLElement>('.jp-LauncherCard')!.title,
      /GPU’s compute is shared/
    );
  });
});
