/**
 * JupyterLab's own "Error Starting Kernel" dialog, when it carries a pool refusal: the server's
 * message is a sentence for the user, not a traceback, so the extension's stylesheet lets it wrap
 * (`.jp-GpuPool-refusalDialog`), and no other dialog. A refusal names the profile as the launcher
 * does, in quotes ("'Python 3 · GPU 10 GiB' cannot start"): that is how it is recognised.
 */

import { Dialog, ReactWidget } from '@jupyterlab/apputils';
import { MessageLoop } from '@lumino/messaging';
import { Panel, PanelLayout, Widget } from '@lumino/widgets';

import type { IProfile } from './types';

/** The class the stylesheet scopes the refusal's wrapping to. */
export const REFUSAL_DIALOG = 'jp-GpuPool-refusalDialog';

/** Whether a dialog's message is the pool's refusal of one of these profiles. */
export function isRefusal(text: string, profiles: ReadonlyArray<IProfile>): boolean {
  return profiles.some(p => text.includes(`'${p.launcher_name}'`) || text.includes(`'${p.name}'`));
}

/** Mark `dialog` when its message (the first `<pre>` of its body) is a refusal; true once marked. */
export function markRefusal(dialog: Element, profiles: ReadonlyArray<IProfile>): boolean {
  if (dialog.classList.contains(REFUSAL_DIALOG)) {
    return true;
  }
  const pre = dialog.querySelector('.jp-Dialog-body > div > pre:first-child');
  if (pre && isRefusal(pre.textContent ?? '', profiles)) {
    dialog.classList.add(REFUSAL_DIALOG);
    return true;
  }
  return false;
}

/**
 * Mark every dialog JupyterLab opens (on the document's body) that carries a refusal. Its body
 * renders a moment after the dialog is attached: each new dialog is watched until it is marked.
 */
export function followRefusalDialogs(profiles: () => ReadonlyArray<IProfile>): MutationObserver {
  const watch = (dialog: Element) => {
    const inner = new MutationObserver(() => {
      if (markRefusal(dialog, profiles())) {
        inner.disconnect();
      }
    });
    if (!markRefusal(dialog, profiles())) {
      inner.observe(dialog, { childList: true, subtree: true });
    }
  };
  const outer = new MutationObserver(records => {
    for (const record of records) {
      record.addedNodes.forEach(node => {
        if (node instanceof Element && node.classList.contains('jp-Dialog')) {
          watch(node);
        }
      });
    }
  });
  outer.observe(document.body, { childList: true });
  return outer;
}

/**
 * After the kernel-start error dialog closes, how long (ms) later errors still go to the
 * notification centre: a page that restores many notebooks gets their errors within seconds.
 */
export const BURST_MS = 10_000;

/**
 * One kernel-start error dialog at a time: JupyterLab opens its modal "Error Starting Kernel" for
 * every notebook whose kernel could not start, one after the other (19 restored tabs, 19 dialogs),
 * and after each a "Select Kernel" dialog for that notebook. The first error shows; the other
 * errors, while it is open or within BURST_MS of its closing, do not, nor does a "Select Kernel"
 * that follows a failed start within BURST_MS (the notebook stays without a kernel until its user
 * picks one).
 */
export class KernelErrorGate {
  /** An error dialog arrives at `now` (ms): true, show it (it is open until `closed`). */
  error(now: number): boolean {
    this._lastError = now;
    if (this._open || now - this._closedAt < BURST_MS) {
      return false;
    }
    this._open = true;
    return true;
  }

  /** The shown error dialog closed at `now` (ms). */
  closed(now: number): void {
    this._open = false;
    this._closedAt = now;
  }

  /** A "Select Kernel" dialog arrives at `now` (ms): false within a burst of failed starts. */
  selection(now: number): boolean {
    return !this._open && now - this._lastError >= BURST_MS;
  }

  private _open = false;
  private _closedAt = -Infinity;
  private _lastError = -Infinity;
}

/**
 * A dialog's title and message (the first `<pre>` of its body), rendered now: JupyterLab draws its
 * header only once the dialog is on screen, and a queued dialog is not yet.
 */
async function dialogText(
  dialog: Dialog<unknown>
): Promise<{ title: string; message: string } | null> {
  const content = dialog.layout instanceof PanelLayout ? dialog.layout.widgets[0] : null;
  if (!(content instanceof Panel) || content.widgets.length < 2) {
    return null;
  }
  const [header, body] = content.widgets;
  for (const part of [header, body]) {
    if (part instanceof ReactWidget) {
      MessageLoop.sendMessage(part, Widget.Msg.UpdateRequest);
      await part.renderPromise;
    }
  }
  return {
    title: header.node.textContent?.trim() ?? '',
    message: body.node.querySelector('pre')?.textContent ?? ''
  };
}

/** JupyterLab's titles of the dialogs a failed start brings, in the user's language. */
export interface IKernelDialogTitles {
  /** "Error Starting Kernel" */
  error: string;
  /** "Select Kernel" */
  select: string;
}

/**
 * Let at most one of JupyterLab's "Error Starting Kernel" dialogs show at a time, and no "Select
 * Kernel" after a failed start (KernelErrorGate); each other one is closed before it shows. An
 * error's message goes to `elsewhere` (a toast), unless it is the pool's refusal, which the pool's
 * own refusal toast already says.
 */
export function oneKernelErrorDialog(
  titles: IKernelDialogTitles,
  profiles: () => ReadonlyArray<IProfile>,
  elsewhere: (message: string) => void,
  gate = new KernelErrorGate()
): void {
  let judged = Promise.resolve(); // in the order they arrive: an error before the selection it brings
  Dialog.tracker.widgetAdded.connect((_, dialog) => {
    const now = Date.now(); // as it arrives: its text renders a moment later
    judged = judged
      .then(() => dialogText(dialog))
      .then(text => {
        if (!text || dialog.isDisposed) {
          return;
        }
        if (text.title.startsWith(titles.select)) {
          if (!gate.selection(now)) {
            dialog.reject();
          }
          return;
        }
        if (!text.title.startsWith(titles.error)) {
          return;
        }
        if (gate.error(now)) {
          dialog.disposed.connect(() => gate.closed(Date.now()));
          return;
        }
        dialog.reject();
        if (!isRefusal(text.message, profiles())) {
          elsewhere(text.message);
        }
      });
    // A dialog that could not be read is left as it is; the next ones are judged all the same.
    judged = judged.catch(error =>
      console.warn('jupyter-gpu-pool: could not read a dialog', error)
    );
  });
}
