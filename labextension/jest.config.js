// The extension template's Jest setup (@jupyterlab/testing): TypeScript through ts-jest, JupyterLab's ES
// modules through Babel, a jsdom environment for the React components.
const jestJupyterLab = require('@jupyterlab/testing/lib/jest-config');

const esModules = [
  '@codemirror',
  '@jupyter/ydoc',
  '@jupyter/react-components',
  '@jupyter/web-components',
  '@jupyterlab/',
  '@microsoft',
  'exenv-es6',
  'lib0',
  'nanoid',
  'vscode-ws-jsonrpc',
  'y-protocols',
  'y-websocket',
  'yjs'
].join('|');

const baseConfig = jestJupyterLab(__dirname);

module.exports = {
  ...baseConfig,
  automock: false,
  reporters: ['default'],
  testRegex: 'src/__tests__/.*\\.spec\\.tsx?$',
  transformIgnorePatterns: [`/node_modules/(?!${esModules}).+`]
};
