/**
 * Identical toasts as one: the same text shown again (eight refused starts of one profile, say)
 * is counted on the toast already there, "… (3 times)", instead of a toast of its own. No DOM
 * here: toasts.ts keeps the notifications.
 */

import { __ } from './i18n';
import { TOAST_LIMIT } from './notices';

/** `message` with its count, within the toast's limit (the message is cut, never the count). */
export function counted(message: string, times: number): string {
  if (times <= 1) {
    return message;
  }
  const suffix = __(' (%1 times)', times);
  const room = TOAST_LIMIT - suffix.length;
  const text = message.length > room ? `${message.slice(0, room - 1)}…` : message;
  return `${text}${suffix}`;
}

interface IGroup {
  id: string;
  message: string;
  keys: Set<string>;
}

/** Which notification shows which text, and for how many notices (their keys). */
export class Repeats {
  /** The notification showing `message`, if it is still `live`; null: a new one is needed. */
  find(message: string, live: (id: string) => boolean): string | null {
    const group = this._byMessage.get(message);
    if (group && live(group.id)) {
      return group.id;
    }
    if (group) {
      this._forget(group);
    }
    return null;
  }

  /** Count the notice `key` under notification `id` showing `message`; returns its times now. */
  add(message: string, key: string, id: string): number {
    let group = this._byMessage.get(message);
    if (!group || group.id !== id) {
      if (group) {
        this._forget(group);
      }
      group = { id, message, keys: new Set() };
      this._byMessage.set(message, group);
    }
    group.keys.add(key);
    this._byKey.set(key, group);
    return group.keys.size;
  }

  /**
   * The notice `key` no longer applies: its notification, its text and how many notices it still
   * counts (0: dismiss it); null where the key was never counted.
   */
  remove(key: string): { id: string; message: string; times: number } | null {
    const group = this._byKey.get(key);
    if (!group) {
      return null;
    }
    this._byKey.delete(key);
    group.keys.delete(key);
    if (!group.keys.size) {
      this._forget(group);
    }
    return { id: group.id, message: group.message, times: group.keys.size };
  }

  private _forget(group: IGroup): void {
    if (this._byMessage.get(group.message) === group) {
      this._byMessage.delete(group.message);
    }
    for (const key of group.keys) {
      this._byKey.delete(key);
    }
  }

  private _byMessage = new Map<string, IGroup>();
  private _byKey = new Map<string, IGroup>();
}
