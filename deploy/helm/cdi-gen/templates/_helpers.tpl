{{/*
Names and labels. With the release named after the chart (`helm install cdi-gen ...`) the
objects are named as deploy/kubernetes names them: cdi-gen, cdi-gen-config, cdi-gen-dra.
*/}}
{{- define "cdi-gen.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "cdi-gen.fullname" -}}
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

{{- define "cdi-gen.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cdi-gen.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "cdi-gen.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "cdi-gen.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "cdi-gen.configMapName" -}}
{{- .Values.existingConfigMap.name | default (printf "%s-config" (include "cdi-gen.fullname" .)) }}
{{- end }}

{{- define "cdi-gen.configKey" -}}
{{- if .Values.existingConfigMap.name }}{{ .Values.existingConfigMap.key }}{{ else }}config.yaml{{ end }}
{{- end }}

{{/*
The config's text: the inline value, or the existing ConfigMap's key as the API server has it
(empty under `helm template`, which reaches no API server).
*/}}
{{- define "cdi-gen.configText" -}}
{{- if .Values.existingConfigMap.name }}
{{- $cm := lookup "v1" "ConfigMap" .Release.Namespace .Values.existingConfigMap.name }}
{{- (($cm).data | default dict) | dig .Values.existingConfigMap.key "" }}
{{- else }}
{{- .Values.config }}
{{- end }}
{{- end }}

{{/*
The config as a map (fromYaml); a config that is not a YAML mapping fails the render here,
naming the value, rather than the agent at start-up.
*/}}
{{- define "cdi-gen.configMap" -}}
{{- $config := include "cdi-gen.configText" . | fromYaml }}
{{- if hasKey $config "Error" }}
{{- fail (printf "config: not a YAML mapping: %s" (get $config "Error" | trunc 120)) }}
{{- end }}
{{- toYaml $config }}
{{- end }}

{{/*
The vendor of the config (the agent's default, cdi-gen.io, when it names none) and the DRA
driver name: dra.driver, else the vendor, checked as the API server checks it.
*/}}
{{- define "cdi-gen.vendor" -}}
{{- $config := include "cdi-gen.configMap" . | fromYaml }}
{{- $config.vendor | default "cdi-gen.io" }}
{{- end }}

{{- define "cdi-gen.driver" -}}
{{- $driver := .Values.dra.driver | default (include "cdi-gen.vendor" .) }}
{{- if or (gt (len $driver) 63) (not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$" $driver)) }}
{{- fail (printf "dra.driver: DRA driver name %q must be a lowercase DNS subdomain (a-z 0-9 - .), at most 63 characters; set dra.driver or use a shorter vendor" ($driver | trunc 80)) }}
{{- end }}
{{- $driver }}
{{- end }}

{{/*
A class may only be served through the chart's API: with `api: devicePlugin` a class whose
config says `api: dra` would need the DRA objects the chart renders only with `api: dra`.
*/}}
{{- define "cdi-gen.checkClasses" -}}
{{- if ne .Values.api "dra" }}
{{- $config := include "cdi-gen.configMap" . | fromYaml }}
{{- range $i, $class := $config.classes | default list }}
{{- if eq (toString (dig "api" "" $class)) "dra" }}
{{- fail (printf "config: classes[%d].api: class %q says dra but the chart's api is devicePlugin; set api: dra (every class through DRA) or drop the class's api" $i (toString $class.name | trunc 60)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
