// Live updates from tesserad's event stream (Server-Sent Events). EventSource cannot
// send headers, so the token goes in the query (?token=), as docs/openapi.json allows.

import * as endpoints from './endpoints.js';

const TYPES = ['worker', 'mesh', 'job', 'checkpoint', 'barrier', 'preemption'];

// Calls onEvent(type, data) for every event and onStatus('live' | 'reconnecting')
// when the stream opens or drops. Returns {close()}.
export function connectEvents(token, {onEvent, onStatus}) {
  let source = null;
  let retry = null;
  let closed = false;

  const open = () => {
    source = new EventSource(endpoints.events(token));
    source.onopen = () => onStatus('live');
    source.onerror = () => {
      onStatus('reconnecting');
      // EventSource retries by itself unless the answer was not a stream (a 401,
      // tesserad gone): then it gives up, and we start over a little later.
      if (source.readyState === EventSource.CLOSED && !closed) {
        clearTimeout(retry);
        retry = setTimeout(open, 3000);
      }
    };
    for (const type of TYPES) {
      source.addEventListener(type, (e) => {
        let data = null;
        try {
          data = JSON.parse(e.data);
        } catch {
          return;
        }
        onEvent(type, data);
      });
    }
  };
  open();
  return {
    close() {
      closed = true;
      clearTimeout(retry);
      if (source) source.close();
    },
  };
}
