// How the agent runs itself as a child: the converge child of the daemon, and the helpers
// NodeGroupConfiguration scripts call back into (bb-package-install → `bashible package`).

/** argv that runs `bashible <args>` on this runtime, without the daemon's memory flags. */
export function agentArgv(args: string[] = []): string[] {
  const execArgv = process.execArgv.filter((a) => a !== "--lite-mode" && a !== "--use-openssl-ca");
  return [process.execPath, ...execArgv, process.argv[1] ?? "", ...args];
}
