/**
 * JupyterLab's own "Error Starting Kernel" dialog, when it carries a pool refusal: the server's
 * message is a sentence for the user, not a traceback, so the extension's stylesheet lets it wrap
 * (`.jp-GpuPool-refusalDialog`), and no other dialog. A refusal names the profile as the launcher
 * does, in quotes ("'Python 3 · GPU 10 GiB' cannot start"): that is how it is recognised.
 */

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
