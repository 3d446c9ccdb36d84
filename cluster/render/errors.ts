// A render failure that names the object at fault, so the Event and the log line tell the
// user what to fix. Any other exception escaping the renderer is a bug.

export class RenderError extends Error {
  override name = "RenderError";
  /** e.g. "NodeUser/root", "NodeGroupConfiguration/sysctl", "context". */
  readonly object: string;
  /** Every object at fault when several are (each NodeGroupConfiguration that failed). */
  readonly causes: readonly RenderError[];
  constructor(object: string, message: string, causes?: RenderError[]) {
    super(causes ? message : `${object}: ${message}`);
    this.object = object;
    this.causes = causes ?? [this];
  }
}
