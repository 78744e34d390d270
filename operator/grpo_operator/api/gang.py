"""The names other systems define for gang admission and gang scheduling (Kueue, scheduler-plugins coscheduling,
Volcano), kept in one place and checked against those projects' own sources by tests/unit/gang.

Pure: standard library only.
"""

from __future__ import annotations

# ---- Kueue's plain-pod integration (kubernetes-sigs/kueue v0.19.2)
# pkg/controller/constants/constants.go
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
# pkg/constants/constants.go: the label, and (PodFinalizer) the finalizer, Kueue's webhook puts on managed pods
KUEUE_MANAGED_LABEL = "kueue.x-k8s.io/managed"
KUEUE_POD_FINALIZER = KUEUE_MANAGED_LABEL
# pkg/controller/jobs/pod/constants/constants.go
KUEUE_GROUP_NAME_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_GROUP_TOTAL_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
KUEUE_RETRIABLE_IN_GROUP_ANNOTATION = "kueue.x-k8s.io/retriable-in-group"
KUEUE_RETRIABLE_IN_GROUP_FALSE = "false"
KUEUE_ADMISSION_GATE = "kueue.x-k8s.io/admission"  # SchedulingGateName
KUEUE_ROLE_HASH_ANNOTATION = "kueue.x-k8s.io/role-hash"
# pkg/controller/jobs/pod/pod_controller.go: the pod condition Kueue sets before it deletes pods it evicts
KUEUE_TERMINATION_TARGET = "TerminationTarget"
# Prefixes of what Kueue writes onto our pods (labels, annotations, gates, finalizer): never ours to revert.
KUEUE_PREFIXES = ("kueue.x-k8s.io/", "provreq.kueue.x-k8s.io/")

# ---- scheduler-plugins coscheduling (kubernetes-sigs/scheduler-plugins)
COSCHEDULING_API_VERSION = "scheduling.x-k8s.io/v1alpha1"
COSCHEDULING_POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"  # apis/scheduling/v1alpha1/types.go PodGroupLabel

# ---- Volcano (volcano-sh/volcano, volcano.sh/apis scheduling/v1beta1)
VOLCANO_API_VERSION = "scheduling.volcano.sh/v1beta1"
VOLCANO_GROUP_NAME_ANNOTATION = "scheduling.k8s.io/group-name"  # labels.go KubeGroupNameAnnotationKey
VOLCANO_SCHEDULER_NAME = "volcano"  # cmd/scheduler/app/options/options.go defaultSchedulerName
VOLCANO_DEFAULT_QUEUE = "default"

POD_GROUP_KIND = "PodGroup"
POD_GROUP_PLURAL = "podgroups"

GANG_COSCHEDULING = "coscheduling"
GANG_VOLCANO = "volcano"
GANGS = (GANG_COSCHEDULING, GANG_VOLCANO)
