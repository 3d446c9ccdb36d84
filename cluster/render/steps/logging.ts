// 083_disable_rsyslog_for_kubelet, 084_configure_journald, 085_rotate_bashible_logs: on every group.
import { journald, logRotation } from "../../../bundles/steps/logging.ts";
import type { SpecBuilder } from "./spec-builder.ts";

export const rsyslogKubeletSpec: SpecBuilder<"RsyslogKubeletFilter"> = () => ({});
export const journaldSpec: SpecBuilder<"Journald"> = () => ({ ...journald.defaults });
export const logRotationSpec: SpecBuilder<"LogRotation"> = () => ({ ...logRotation.defaults });
