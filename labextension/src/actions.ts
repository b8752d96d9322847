/**
 * What the user's and the admin's buttons do: ask first where a kernel's state
 * (or a running computation) is at stake, call the server, say what happened
 * (a note in the notification centre; a refusal, a toast: toasts.ts), and give
 * the keyboard focus back to the button that asked.
 */

import type { JupyterFrontEnd } from '@jupyterlab/application';
import { Dialog } from '@jupyterlab/apputils';

import type { ILeaseRow } from './admin';
import type { AdminRequests } from './requests';
import { formatClock } from './format';
import { __ } from './i18n';
import type { PoolModel } from './model';
import { kernelOf } from './notices';
import type { AdminAction, IKernel } from './types';
import type { IActionView } from './view';

/** Where the actions say what they did. */
export interface INotes {
  /** What was done: the notification centre keeps it, no toast. */
  note(kernelId: string, message: string): void;
  /** The user's action was refused or failed: a toast. */
  failed(kernelId: string, message: string): void;
}

/**
 * Milliseconds after a question opens during which a click beside it does not close it: the second
 * click of a double click on the button that asked lands there (JupyterLab's dialog closes on a
 * click outside it), and the question vanished before it was seen.
 */
export const CONFIRM_GUARD_MS = 600;

/** Ask; true when the user accepted. Focus goes back to `opener` however the dialog closes. */
export async function confirm(
  confirm: { title: string; body: string; button: string },
  opener: HTMLElement | null
): Promise<boolean> {
  const dialog = new Dialog({
    title: confirm.title,
    body: confirm.body,
    buttons: [
      Dialog.cancelButton({ label: __('Cancel') }),
      Dialog.warnButton({ label: confirm.button })
    ]
  });
  dialog.addClass('jp-GpuPool-dialog'); // the product's own question (the browser tests check it with axe-core)
  const opened = Date.now();
  // Before the dialog's own listener (a capture listener on the window runs first).
  const guard = (event: MouseEvent) => {
    const target = event.target as Node | null;
    const content = dialog.node.querySelector('.jp-Dialog-content');
    if (
      Date.now() - opened < CONFIRM_GUARD_MS &&
      target !== null &&
      dialog.node.contains(target) &&
      !content?.contains(target)
    ) {
      event.stopImmediatePropagation();
      event.preventDefault();
    }
  };
  window.addEventListener('click', guard, true);
  try {
    const result = await dialog.launch();
    return result.button.accept;
  } finally {
    window.removeEventListener('click', guard, true);
    if (opener && opener.isConnected) {
      opener.focus();
    }
  }
}

/** "14:05" now, by the server's clock. */
function nowClock(model: PoolModel): string {
  return formatClock(model.serverNow());
}

/** Keep alive: postpone the pending action. */
export async function keepAlive(model: PoolModel, kernelId: string, notes: INotes): Promise<void> {
  try {
    const kernel = await model.client.snooze(kernelId);
    notes.note(
      kernelId,
      __('At %1, %2 was kept alive.', nowClock(model), kernelOf(kernel?.name, true))
    );
  } catch (error) {
    notes.failed(kernelId, __('Could not keep the kernel alive: %1', (error as Error).message));
  }
  await model.refresh();
}

/** Release GPU: give the slice back now (hibernate where the rule and kernel allow, else shut down). */
export async function release(
  model: PoolModel,
  kernel: Pick<IKernel, 'kernel_id' | 'name'>,
  notes: INotes
): Promise<void> {
  try {
    const { action: done } = await model.client.release(kernel.kernel_id);
    const who = kernelOf(kernel.name, true);
    notes.note(
      kernel.kernel_id,
      done === 'hibernate'
        ? __(
            'At %1, you released the GPU slice of %2: it hibernates, its variables kept.',
            nowClock(model),
            who
          )
        : __('At %1, you released the GPU slice of %2: it shuts down.', nowClock(model), who)
    );
  } catch (error) {
    notes.failed(kernel.kernel_id, __('GPU pool: %1', (error as Error).message));
  }
  await model.refresh();
}

/** Shut down the kernel through its session (so the notebook shows "No Kernel"), else directly. */
export async function shutdownKernel(app: JupyterFrontEnd, kernelId: string): Promise<void> {
  const { sessions, kernels } = app.serviceManager;
  await sessions.refreshRunning();
  for (const session of sessions.running()) {
    if (session.kernel?.id === kernelId) {
      await sessions.shutdown(session.id);
      return;
    }
  }
  await kernels.shutdown(kernelId);
}

/** One of the user's actions on their kernel (a card's button, or a command). */
export async function runAction(
  app: JupyterFrontEnd,
  model: PoolModel,
  kernel: Pick<IKernel, 'kernel_id' | 'name'>,
  action: IActionView,
  opener: HTMLElement | null,
  notes: INotes
): Promise<void> {
  if (action.confirm && !(await confirm(action.confirm, opener))) {
    return;
  }
  const kernelId = kernel.kernel_id;
  switch (action.action) {
    case 'snooze':
      return keepAlive(model, kernelId, notes);
    case 'release':
      return release(model, kernel, notes);
  }
  try {
    if (action.action === 'resume') {
      await model.client.resume(kernelId);
    } else {
      await shutdownKernel(app, kernelId);
    }
  } catch (error) {
    notes.failed(kernelId, __('GPU pool: %1', (error as Error).message));
  }
  await model.refresh();
}

/** The question before an admin's action on someone's kernel. */
function adminQuestion(
  action: AdminAction,
  who: string
): { title: string; body: string; button: string } {
  switch (action) {
    case 'release':
      return {
        title: __('Release GPU'),
        body: __(
          'Give the GPU slice of %1 back now? It hibernates where its rule says so and it can, else it shuts down and its variables are lost.',
          who
        ),
        button: __('Release')
      };
    case 'hibernate':
      return {
        title: __('Hibernate kernel'),
        body: __(
          'Hibernate %1 now? Its GPU slice goes back to the pool; its variables are kept and it resumes when its user runs a cell.',
          who
        ),
        button: __('Hibernate')
      };
    default:
      return {
        title: __('Shut down kernel'),
        body: __(
          'Shut down %1 now? Its variables will be lost; its user is told that an admin did it.',
          who
        ),
        button: __('Shut down')
      };
  }
}

/**
 * An admin's action on any user's lease, from the dashboard: the lease's row shows it under way
 * (AdminRequests) until it is carried out or refused.
 */
export async function adminAct(
  model: PoolModel,
  row: ILeaseRow,
  action: AdminAction,
  opener: HTMLElement | null,
  notes: INotes,
  requests: AdminRequests
): Promise<void> {
  const who = __('%1’s %2', row.owner, row.notebook);
  if (!(await confirm(adminQuestion(action, who), opener))) {
    return;
  }
  const lease = model.pool?.leases.find(l => l.kernel_id === row.kernelId);
  const at = model.serverNow();
  try {
    const reply = await model.client.act(row.kernelId, action);
    requests.add({
      kernelId: row.kernelId,
      who,
      action,
      at,
      state: lease?.state ?? '',
      phase: lease?.phase ?? '',
      elsewhere: !!reply.requested // another server's kernel: asked of that server
    });
    notes.note('', adminNote(action, who, formatClock(at), !!reply.requested));
  } catch (error) {
    notes.failed('', __('GPU pool: %1', (error as Error).message));
  }
  await Promise.all([model.refresh(), model.refreshPool()]);
}

/** What the notification centre keeps of an admin's action. */
function adminNote(action: AdminAction, who: string, at: string, elsewhere: boolean): string {
  switch (action) {
    case 'hibernate':
      return elsewhere
        ? __('At %1, you asked the server of %2 to hibernate it.', at, who)
        : __('At %1, you hibernated %2.', at, who);
    case 'shutdown':
      return elsewhere
        ? __('At %1, you asked the server of %2 to shut it down.', at, who)
        : __('At %1, you shut down %2.', at, who);
    default:
      return elsewhere
        ? __('At %1, you asked the server of %2 to give its GPU slice back.', at, who)
        : __('At %1, you released the GPU slice of %2.', at, who);
  }
}
