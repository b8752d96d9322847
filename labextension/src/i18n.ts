/**
 * Every user-visible string goes through JupyterLab's ITranslator, in the
 * extension's own domain. The plugin hands the translator over at activation;
 * until then (and in the unit tests) the null translator formats the English
 * text, placeholders included.
 */

import { ITranslator, nullTranslator, TranslationBundle } from '@jupyterlab/translation';

export const DOMAIN = 'jupyter_gpu_pool';

let bundle: TranslationBundle = nullTranslator.load(DOMAIN);

export function setTranslator(translator: ITranslator): void {
  bundle = translator.load(DOMAIN);
}

/** A message, `%1`, `%2`… replaced by `args`. */
export function __(msgid: string, ...args: Array<string | number>): string {
  return bundle.__(msgid, ...args);
}

/** A message whose form depends on `n` (`%1` is `n`, `%2`… are `args`). */
export function _n(
  singular: string,
  plural: string,
  n: number,
  ...args: Array<string | number>
): string {
  return bundle._n(singular, plural, n, ...args);
}
