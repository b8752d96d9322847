import assert from 'node:assert/strict';

import {
  BURST_MS,
  followRefusalDialogs,
  isRefusal,
  KernelErrorGate,
  markRefusal,
  REFUSAL_DIALOG
} from '../dialogs';
import { profiles } from './fixtures';

/** JupyterLab's "Error Starting Kernel" dialog: the message in the first <pre> of its body. */
function errorDialog(message: string | null): HTMLElement {
  const dialog = document.createElement('dialog');
  dialog.className = 'jp-Dialog';
  dialog.innerHTML = '<div class="jp-Dialog-content"><div class="jp-Dialog-body"></div></div>';
  if (message !== null) {
    fill(dialog, message);
  }
  return dialog;
}

function fill(dialog: HTMLElement, message: string): void {
  const body = document.createElement('div');
  const pre = document.createElement('pre');
  pre.textContent = message;
  body.appendChild(pre);
  dialog.querySelector('.jp-Dialog-body')!.appendChild(body);
}

const REFUSAL =
  "GPU quota exceeded: you hold 2 of your 2 GPU kernels, so 'Python 3 · GPU 10 GiB' cannot start.";

describe('refusal dialogs', () => {
  const known = profiles({});

  it('recognises a refusal by the profile it names, as the launcher does or by its id', () => {
    assert.equal(isRefusal(REFUSAL, known), true);
    assert.equal(isRefusal("the kernel on profile 'gpu-20g' cannot start or resume", known), true);
    assert.equal(isRefusal('No such kernel named python4', known), false);
  });

  it('marks only the dialog that carries a refusal', () => {
    const refused = errorDialog(REFUSAL);
    const other = errorDialog('Traceback: ImportError: no module named ipykernel');
    assert.equal(markRefusal(refused, known), true);
    assert.equal(markRefusal(other, known), false);
    assert.ok(refused.classList.contains(REFUSAL_DIALOG));
    assert.ok(!other.classList.contains(REFUSAL_DIALOG));
  });

  it('marks a dialog whose body renders after it is attached', async () => {
    const observer = followRefusalDialogs(() => known);
    const dialog = errorDialog(null);
    const plain = errorDialog(null);
    document.body.append(dialog, plain);
    await Promise.resolve();
    assert.ok(!dialog.classList.contains(REFUSAL_DIALOG));
    fill(dialog, REFUSAL);
    fill(plain, 'Kernel died');
    await new Promise(resolve => setTimeout(resolve, 0));
    assert.ok(dialog.classList.contains(REFUSAL_DIALOG));
    assert.ok(!plain.classList.contains(REFUSAL_DIALOG));
    observer.disconnect();
    dialog.remove();
    plain.remove();
  });
});

describe('one kernel-error dialog at a time', () => {
  it('shows the first error, none while it is open, none within the burst after it closed', () => {
    const gate = new KernelErrorGate();
    assert.equal(gate.error(0), true);
    for (let i = 1; i < 19; i++) {
      assert.equal(gate.error(i * 100), false); // a restore's other 18 tabs
    }
    gate.closed(5_000);
    assert.equal(gate.error(5_000 + BURST_MS - 1), false);
    assert.equal(gate.error(5_000 + 2 * BURST_MS), true); // a later failure is news again
  });

  it('asks no "Select Kernel" after a failed start, only when none failed lately', () => {
    const gate = new KernelErrorGate();
    assert.equal(gate.selection(0), true); // the user's own choice of kernel
    gate.error(1_000);
    assert.equal(gate.selection(1_500), false); // what JupyterLab asks after the failure
    gate.closed(60_000); // read for a minute; the burst's selections came long before
    assert.equal(gate.selection(60_000 + BURST_MS), true);
  });
});
