/* A Web Worker stand-in for pages opened from disk (file://), written for minikv's site.
 *
 * Chromium and Firefox refuse `new Worker(url)` for a file:// URL, and mkdocs-material's search runs in a worker,
 * so a site opened from disk would say "Initializing search" for good. mkdocs-material's offline plugin inlines
 * the search index (search/search_index.js) and, unless a polyfill whose name contains "iframe-worker" is
 * configured, loads one from a CDN. This is that polyfill, local: the worker's script runs in a hidden same-origin
 * iframe, and messages are passed between the page and the iframe as MessageEvents. Served over http(s) it does
 * nothing: real workers are used.
 */
(function () {
  "use strict";
  if (location.protocol !== "file:" || typeof window === "undefined") return;

  class IFrameWorker extends EventTarget {
    constructor(url) {
      super();
      this.onmessage = null;
      this.onerror = null;
      this._queue = [];
      this._ready = false;
      this._frame = document.createElement("iframe");
      this._frame.setAttribute("aria-hidden", "true");
      this._frame.setAttribute("tabindex", "-1");
      this._frame.style.cssText = "position:absolute;width:0;height:0;border:0;visibility:hidden";
      (document.body || document.documentElement).appendChild(this._frame);
      const scope = this._frame.contentWindow;
      const page = this;
      // The worker's side: postMessage() answers the page; importScripts() loads scripts in order.
      scope.postMessage = function (data) { page._emit(data); };
      scope.importScripts = function (...urls) {
        for (const src of urls) {
          const script = scope.document.createElement("script");
          script.src = new URL(src, url).href;
          script.async = false;
          scope.document.head.appendChild(script);
        }
      };
      const script = scope.document.createElement("script");
      script.src = new URL(url, location.href).href;
      script.onload = () => {
        this._ready = true;
        for (const data of this._queue.splice(0)) this._deliver(data);
      };
      script.onerror = (event) => {
        const error = new ErrorEvent("error", { message: `could not load worker script ${url}` });
        this.dispatchEvent(error);
        if (typeof this.onerror === "function") this.onerror(error);
      };
      scope.document.head.appendChild(script);
    }

    postMessage(data) {
      if (this._ready) this._deliver(data);
      else this._queue.push(data);
    }

    terminate() {
      this._frame.remove();
    }

    _deliver(data) {
      const scope = this._frame.contentWindow;
      setTimeout(() => scope.dispatchEvent(new scope.MessageEvent("message", { data })), 0);
    }

    _emit(data) {
      setTimeout(() => {
        const event = new MessageEvent("message", { data });
        this.dispatchEvent(event);
        if (typeof this.onmessage === "function") this.onmessage(event);
      }, 0);
    }
  }

  window.Worker = IFrameWorker;
})();
