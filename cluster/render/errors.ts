// A render failure that names the object at fault, so the Event and the log line tell the
// user what to fix. Any other exception escaping the renderer is a bug.

export class RenderError extends Error {
  override name = "RenderError";
  /** e.g. "NodeUser/root", "NodeGroupConfiguration/sysctl", "context". */
  readonly object: string;
  constructor(object: string, message: string) {
    super(`${object}: ${message}`);
    this.object = object;
  }
}
