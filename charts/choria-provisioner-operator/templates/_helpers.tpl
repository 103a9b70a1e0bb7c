{{/*
Chart name, shortened to the 63 characters a label value may hold.
*/}}
{{- define "cpo.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified name: the release name alone when it already contains the chart
name (so "helm install choria-provisioner-operator" gives short names).
*/}}
{{- define "cpo.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "cpo.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "cpo.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cpo.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "cpo.labels" -}}
helm.sh/chart: {{ include "cpo.chart" . }}
{{ include "cpo.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: choria-provisioner
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "cpo.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "cpo.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "cpo.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
The Lease the operator campaigns for. Its name is fixed in the operator; it lives
in the watched namespace when there is one (--namespace), otherwise in the
operator's own (the release namespace).
*/}}
{{- define "cpo.leaseName" -}}
choria-provisioner-operator
{{- end }}

{{/*
The ClusterRoles the operator binds to provisioner pods (it holds only `bind` on
them): Leases for the Lease election, CertificateRequests for cert-manager.
*/}}
{{- define "cpo.leaseClusterRole" -}}
{{- printf "%s-leases" (include "cpo.fullname" .) }}
{{- end }}

{{- define "cpo.certManagerClusterRole" -}}
{{- printf "%s-certificaterequests" (include "cpo.fullname" .) }}
{{- end }}

{{/*
The ValidatingAdmissionPolicy (and its binding) the operator applies to bound
what provisioner pods may ask cert-manager for.
*/}}
{{- define "cpo.admissionPolicy" -}}
{{- printf "%s-pod-certificaterequests" (include "cpo.fullname" .) }}
{{- end }}

{{/*
The ValidatingAdmissionPolicy (and its binding) the operator applies to refuse,
when a Provisioner is written, a spec.pod priority class or volume type the
policy values do not allow.
*/}}
{{- define "cpo.provisionerAdmissionPolicy" -}}
{{- printf "%s-provisioners" (include "cpo.fullname" .) }}
{{- end }}

{{- define "cpo.leaseNamespace" -}}
{{- default .Release.Namespace .Values.watchNamespace }}
{{- end }}

{{/*
Refuse combinations that cannot work, with a message saying what to change.
*/}}
{{- define "cpo.validate" -}}
{{- if and (gt (int .Values.replicas) 1) (not .Values.leaderElection.enabled) }}
{{- fail "replicas > 1 needs leaderElection.enabled: several replicas without the Lease would reconcile the same Provisioners at once" }}
{{- end }}
{{- end }}
