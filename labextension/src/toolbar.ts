/**
 * What the extension adds to each notebook: the slice its kernel holds in the
 * toolbar, and the hints that wake its sleeping kernel before a cell runs.
 */

import { JupyterFrontEnd } from '@jupyterlab/application';
import { DocumentRegistry, DocumentWidget } from '@jupyterlab/docregistry';

import { Hints } from './hints';
import { PoolModel } from './model';
import { Notebooks } from './notebooks';
import { SliceIndicator } from './widgets';

/** Each notebook opened: followed by ``notebooks``, hinted while edited, and its slice indicator placed. */
export function extendNotebooks(
  app: JupyterFrontEnd,
  model: PoolModel,
  notebooks: Notebooks,
  hints: Hints,
  hintCurrent: () => void,
  openPanel: () => void
): void {
  app.docRegistry.addWidgetExtension('Notebook', {
    createNew: (
      widget: DocumentWidget,
      context: DocumentRegistry.IContext<DocumentRegistry.IModel>
    ) => {
      notebooks.add(widget, context);
      // Resume before the cell runs: a cell's editor focused or typed in, and the notebook's kernel known.
      const kernelOf = () => context.sessionContext.session?.kernel?.id;
      const editing = (event: Event) => {
        if ((event.target as Element | null)?.closest?.('.jp-Cell')) {
          hints.touch(kernelOf());
        }
      };
      widget.node.addEventListener('focusin', editing);
      widget.node.addEventListener('keydown', editing);
      context.sessionContext.ready
        .then(() => {
          if (notebooks.tracker.currentWidget === widget) {
            hintCurrent();
          }
        })
        .catch(() => undefined);
      // JupyterLab's toolbar moves its last items into its "…" menu when the notebook is narrow (the
      // kernel's name among the first): the indicator goes before the cell type, so that where the GPU
      // is (and "declared") stays in sight at 1024 px.
      const indicator = new SliceIndicator(model, context.sessionContext, openPanel);
      const placed =
        widget.toolbar.insertBefore('cellType', 'gpuPoolSlice', indicator) ||
        widget.toolbar.insertAfter('kernelName', 'gpuPoolSlice', indicator);
      if (!placed) {
        widget.toolbar.addItem('gpuPoolSlice', indicator);
      }
      return indicator;
    }
  });
}
