{{/* Names */}}
{{- define "grpo-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "grpo-operator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "grpo-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "grpo-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "grpo-operator.webhookServiceName" -}}
{{- printf "%s-webhook" (include "grpo-operator.fullname" .) -}}
{{- end -}}

{{- define "grpo-operator.webhookConfigName" -}}
{{- default (printf "%s.grpo.dev" (include "grpo-operator.fullname" .)) .Values.webhook.configurationName -}}
{{- end -}}

{{- define "grpo-operator.certificateName" -}}
{{- printf "%s-webhook" (include "grpo-operator.fullname" .) -}}
{{- end -}}

{{- define "grpo-operator.certSecretName" -}}
{{- printf "%s-webhook-tls" (include "grpo-operator.fullname" .) -}}
{{- end -}}

{{- define "grpo-operator.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if hasPrefix "@" $tag -}}
{{- printf "%s%s" .Values.image.repository $tag -}}
{{- else if hasPrefix "sha256:" $tag -}}
{{- printf "%s@%s" .Values.image.repository $tag -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* Labels */}}
{{- define "grpo-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "grpo-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The selector labels as k=v,k2=v2 (GRPO_OPERATOR_POD_LABELS: the per-job NetworkPolicies admit these pods). */}}
{{- define "grpo-operator.selectorLabelPairs" -}}
{{- $pairs := list }}
{{- range $k, $v := include "grpo-operator.selectorLabels" . | fromYaml }}
{{- $pairs = append $pairs (printf "%s=%s" $k $v) }}
{{- end }}
{{- join "," $pairs }}
{{- end -}}

{{- define "grpo-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "grpo-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: grpo-operator
{{- end -}}

{{/* Modes */}}
{{- define "grpo-operator.clusterwide" -}}
{{- if not .Values.watch.namespaces -}}true{{- end -}}
{{- end -}}

{{/* replicaCount > 1: leader election on a Lease (grpo-operator --leader-elect) */}}
{{- define "grpo-operator.leaderElect" -}}
{{- if gt (int .Values.replicaCount) 1 -}}true{{- end -}}
{{- end -}}

{{- define "grpo-operator.leaseName" -}}
{{- .Values.leaderElection.leaseName | default (include "grpo-operator.fullname" .) -}}
{{- end -}}

{{- define "grpo-operator.operatorManagedWebhook" -}}
{{- if and .Values.webhook.enabled (eq .Values.webhook.certificates "operator") -}}true{{- end -}}
{{- end -}}

{{- define "grpo-operator.certManagerWebhook" -}}
{{- if and .Values.webhook.enabled (eq .Values.webhook.certificates "cert-manager") -}}true{{- end -}}
{{- end -}}

{{/* Combinations the schema cannot explain well: refuse them with a message. */}}
{{- define "grpo-operator.checks" -}}
{{- if and (include "grpo-operator.leaderElect" .) (include "grpo-operator.operatorManagedWebhook" .) -}}
{{- fail (printf "replicaCount=%d needs webhook.certificates=cert-manager (every replica must serve the webhook with the same certificate; with certificates=operator each replica would generate its own CA and overwrite the others' caBundle) or webhook.enabled=false" (int .Values.replicaCount)) -}}
{{- end -}}
{{- if and (not .Values.rbac.create) (not .Values.serviceAccount.create) (not .Values.serviceAccount.name) -}}
{{- fail "rbac.create=false and serviceAccount.create=false: set serviceAccount.name to an existing ServiceAccount that has the operator's permissions (see docs/install.md)" -}}
{{- end -}}
{{- end -}}

{{/*
Namespace-scoped rules: exactly the verbs the operator uses (grpo_operator/controller/: handlers.py, kube.py; kopf).
The reason for each is in docs/install.md ("RBAC").
*/}}
{{- define "grpo-operator.namespacedRules" -}}
- apiGroups: ["grpo.dev"]
  resources: ["grpojobs"]
  verbs: ["list", "watch", "delete"]
- apiGroups: ["grpo.dev"]
  resources: ["grpojobs/status"]
  verbs: ["patch"]
# the owner references on a job's children set blockOwnerDeletion: OwnerReferencesPermissionEnforcement (on by
# default in OpenShift) refuses them without update on the owner's finalizers
- apiGroups: ["grpo.dev"]
  resources: ["grpojobs/finalizers"]
  verbs: ["update"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "get", "create", "delete"]
- apiGroups: [""]
  resources: ["services", "configmaps"]
  verbs: ["get", "create"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- if .Values.networkPolicy.perJob }}
# each job's NetworkPolicy (networkPolicy.perJob): created with its other children, get as for them (owner check),
# update to put back what render produces when it differs (a new operator configuration, a hand edit); never
# deleted by the operator: it is owned by the job and garbage-collected with it
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "create", "update"]
{{- end }}
{{- end -}}

{{/*
Operator-managed webhook configuration (webhook.certificates=operator): the chart creates the (empty)
ValidatingWebhookConfiguration; the operator only patches that one object (URL/Service + caBundle,
controller/webhookconfig.py). No create (RBAC cannot limit create by name) and nothing on mutating configurations.
*/}}
{{- define "grpo-operator.webhookRules" -}}
- apiGroups: ["admissionregistration.k8s.io"]
  resources: ["validatingwebhookconfigurations"]
  resourceNames: [{{ include "grpo-operator.webhookConfigName" . | quote }}]
  verbs: ["patch"]
{{- end -}}

{{/* policy/v1 PodDisruptionBudget from Kubernetes 1.21 (the 1.20 API has only v1beta1, removed in 1.25). */}}
{{- define "grpo-operator.pdbApiVersion" -}}
{{- if semverCompare ">=1.21-0" .Capabilities.KubeVersion.Version -}}policy/v1{{- else -}}policy/v1beta1{{- end -}}
{{- end -}}

{{/*
The replicas' placement (replicaCount > 1, highAvailability): anti-affinity on the node while `affinity` is empty,
and a spread over zones. A single replica gets neither.
*/}}
{{- define "grpo-operator.affinity" -}}
{{- if .Values.affinity -}}
{{- toYaml .Values.affinity -}}
{{- else if and (include "grpo-operator.leaderElect" .) (ne .Values.highAvailability.podAntiAffinity "none") -}}
{{- $term := dict "topologyKey" "kubernetes.io/hostname" "labelSelector" (dict "matchLabels" (include "grpo-operator.selectorLabels" . | fromYaml)) -}}
podAntiAffinity:
{{- if eq .Values.highAvailability.podAntiAffinity "hard" }}
  requiredDuringSchedulingIgnoredDuringExecution:
    {{- toYaml (list $term) | nindent 4 }}
{{- else }}
  preferredDuringSchedulingIgnoredDuringExecution:
    {{- toYaml (list (dict "weight" 100 "podAffinityTerm" $term)) | nindent 4 }}
{{- end }}
{{- end -}}
{{- end -}}

{{- define "grpo-operator.topologySpread" -}}
{{- $ts := .Values.highAvailability.topologySpread -}}
{{- if and (include "grpo-operator.leaderElect" .) $ts.enabled -}}
- maxSkew: {{ $ts.maxSkew }}
  topologyKey: {{ $ts.topologyKey }}
  whenUnsatisfiable: {{ $ts.whenUnsatisfiable }}
  labelSelector:
    matchLabels:
      {{- include "grpo-operator.selectorLabels" . | nindent 6 }}
{{- end -}}
{{- end -}}
