/**
 * A button that asks first does not swallow a double click: JupyterLab's dialog closes on a click
 * beside it, and the second click of a double click on Shut down (or Release GPU) landed there, so
 * the question vanished before it was seen, and nothing happened.
 */
import assert from 'node:assert/strict';

import { confirm, CONFIRM_GUARD_MS } from '../actions';

const QUESTION = { title: 'Shut down kernel', body: 'Shut down a.ipynb?', button: 'Shut down' };

function backdrop(): HTMLElement {
  const dialog = document.querySelector('.jp-Dialog') as HTMLElement | null;
  assert.ok(dialog, 'the question is on screen');
  return dialog;
}

async function rendered(): Promise<void> {
  for (let i = 0; i < 50 && !document.querySelector('.jp-Dialog .jp-Dialog-content'); i++) {
    await new Promise(resolve => setTimeout(resolve, 10));
  }
}

describe('a question after a double click', () => {
  let now = 1_000_000;
  beforeEach(() => {
    jest.spyOn(Date, 'now').mockImplementation(() => now);
  });
  afterEach(() => {
    jest.restoreAllMocks();
  });

  it('stays open when the second click lands beside it, and closes on a later click there', async () => {
    const opener = document.createElement('button');
    document.body.appendChild(opener);
    const answer = confirm(QUESTION, opener);
    await rendered();
    // The double click's second click: beside the question, a moment after it opened.
    now += 150;
    backdrop().dispatchEvent(new MouseEvent('mousedown', { bubbles: true }));
    backdrop().dispatchEvent(new MouseEvent('click', { bubbles: true }));
    await new Promise(resolve => setTimeout(resolve, 20));
    assert.ok(document.querySelector('.jp-Dialog'), 'the question is still there');
    // A click beside it once the guard is over closes it, as JupyterLab's dialogs do: no.
    now += CONFIRM_GUARD_MS;
    backdrop().dispatchEvent(new MouseEvent('mousedown', { bubbles: true }));
    backdrop().dispatchEvent(new MouseEvent('click', { bubbles: true }));
    assert.equal(await answer, false);
    assert.equal(document.activeElement, opener); // the focus back where it was
    opener.remove();
  });

  it('is answered by its own buttons at once', async () => {
    const answer = confirm(QUESTION, null);
    await rendered();
    const yes = [...document.querySelectorAll('.jp-Dialog button')].find(
      b => b.textContent === 'Shut down'
    ) as HTMLButtonElement;
    yes.click();
    assert.equal(await answer, true);
  });
});
