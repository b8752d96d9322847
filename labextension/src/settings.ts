/**
 * The user's settings (schema/plugin.json), applied as they load and whenever
 * the user changes them.
 */

import { ISettingRegistry } from '@jupyterlab/settingregistry';

export interface ISettings {
  pollInterval: number;
  muteNotifications: boolean;
  hideStatusItem: boolean;
}

export const DEFAULTS: ISettings = {
  pollInterval: 3,
  muteNotifications: false,
  hideStatusItem: false
};

/** Load the plugin's settings into ``settings`` and call ``applied`` each time they change. */
export function followSettings(
  registry: ISettingRegistry,
  pluginId: string,
  settings: ISettings,
  applied: () => void
): void {
  const apply = (loaded: ISettingRegistry.ISettings) => {
    const composite = loaded.composite as unknown as Partial<ISettings>;
    settings.pollInterval = composite.pollInterval ?? DEFAULTS.pollInterval;
    settings.muteNotifications = composite.muteNotifications ?? DEFAULTS.muteNotifications;
    settings.hideStatusItem = composite.hideStatusItem ?? DEFAULTS.hideStatusItem;
    applied();
  };
  registry
    .load(pluginId)
    .then(loaded => {
      apply(loaded);
      loaded.changed.connect(apply);
    })
    .catch(reason => console.error(`${pluginId}: could not load the settings`, reason));
}
