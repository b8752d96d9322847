/**
 * What the user's and the admin's buttons do: ask first where a kernel's state
 * (or a running computation) is at stake, call the server, say what happened,
 * and give the keyboard focus back to the button that asked.
 */

import type { JupyterFrontEnd } from '@jupyterlab/application';
import { Dialog, Notification } from '@jupyterlab/apputils';

import type { ILeaseRow } from './admin';
import { __ } from './i18n';
import type { PoolModel } from './model';
import { kernelOf } from './notices';
import type { AdminAction, IKernel } from './types';
import type { IActionView } from './view';

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
  try {
    const result = await dialog.launch();
    return result.button.accept;
  } finally {
    if (opener && opener.isConnected) {
      opener.focus();
    }
  }
}

/** Keep alive: postpone the pending action. */
export async function keepAlive(model: PoolModel, kernelId: string): Promise<void> {
  try {
    const kernel = await model.client.snooze(kernelId);
    // Tagged with the kernel: its next warning or explanation withdraws this toast (toasts.ts).
    Notification.success(__('%1 is kept alive: it keeps its GPU slice.', kernelOf(kernel?.name)), {
      autoClose: 5000,
      data: { gpuPoolKernel: kernelId }
    });
  } catch (error) {
    Notification.error(__('Could not keep the kernel alive: %1', (error as Error).message), {
      autoClose: false
    });
  }
  await model.refresh();
}

/** Release GPU: give the slice back now (hibernate where the rule and kernel allow, else shut down). */
export async function release(
  model: PoolModel,
  kernel: Pick<IKernel, 'kernel_id' | 'name'>
): Promise<void> {
  const { action: done } = await model.client.release(kernel.kernel_id);
  Notification.info(
    done === 'hibernate'
      ? __(
          '%1 hibernates: its GPU slice goes back, its variables stay. Run a cell to resume it.',
          kernelOf(kernel.name)
        )
      : __('%1 shuts down to give its GPU slice back.', kernelOf(kernel.name)),
    { autoClose: 5000, data: { gpuPoolKernel: kernel.kernel_id } }
  );
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
  opener: HTMLElement | null
): Promise<void> {
  if (action.confirm && !(await confirm(action.confirm, opener))) {
    return;
  }
  const kernelId = kernel.kernel_id;
  try {
    switch (action.action) {
      case 'snooze':
        await keepAlive(model, kernelId);
        return;
      case 'release':
        await release(model, kernel);
        break;
      case 'resume':
        await model.client.resume(kernelId);
        break;
      case 'shutdown':
        await shutdownKernel(app, kernelId);
        break;
    }
  } catch (error) {
    Notification.error(__('GPU pool: %1', (error as Error).message), { autoClose: false });
  }
  await model.refresh();
}

/** An admin's action on any user's lease, from the dashboard. */
export async function adminAct(
  model: PoolModel,
  row: ILeaseRow,
  action: AdminAction,
  opener: HTMLElement | null
): Promise<void> {
  const who = __('%1’s %2', row.owner, row.notebook);
  const ask = {
    release: {
      title: __('Release GPU'),
      body: __(
        'Give the GPU slice of %1 back now? It hibernates where its rule says so and it can, else it shuts down and its variables are lost.',
        who
      ),
      button: __('Release')
    },
    hibernate: {
      title: __('Hibernate kernel'),
      body: __(
        'Hibernate %1 now? Its GPU slice goes back to the pool; its variables are kept and it resumes when its user runs a cell.',
        who
      ),
      button: __('Hibernate')
    },
    shutdown: {
      title: __('Shut down kernel'),
      body: __(
        'Shut down %1 now? Its variables will be lost; its user is told that an admin did it.',
        who
      ),
      button: __('Shut down')
    }
  }[action];
  if (!(await confirm(ask, opener))) {
    return;
  }
  try {
    const reply = await model.client.act(row.kernelId, action);
    const later = reply.requested; // another server's kernel: asked of that server
    const done =
      reply.action === 'hibernate'
        ? later
          ? __('%1 hibernates at the next pass of its own server (asked of it now).', who)
          : __('%1 hibernates now.', who)
        : reply.action === 'shutdown'
          ? later
            ? __('%1 shuts down at the next pass of its own server (asked of it now).', who)
            : __('%1 shuts down now.', who)
          : later
            ? __(
                '%1 gives its GPU slice back at the next pass of its own server (asked of it now).',
                who
              )
            : __('%1 gives its GPU slice back now.', who);
    Notification.info(done, { autoClose: 5000 });
  } catch (error) {
    Notification.error(__('GPU pool: %1', (error as Error).message), { autoClose: false });
  }
  await Promise.all([model.refresh(), model.refreshPool()]);
}
